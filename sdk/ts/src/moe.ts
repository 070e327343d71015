// RemoteMixtureOfExperts: each sample goes to the k best experts of a
// grid, found by a server's DiscoveryService beam search, and their
// outputs are mixed by a softmax of their scores over those that answered
// (forward only: training goes through Python or Go). Like the Go and
// Python mixtures, it bans a failing server with backoff, prefers what it
// measured over a record's claimed load, and can pin host keys.
import { createClient } from "@connectrpc/connect";
import { DiscoveryService, type Endpoint } from "./gen/moehost/v1/discovery_pb.js";
import { createMoehostClient, createTransport, float32Tensor, toFloat32Array, type ClientOptions, type MoehostClient } from "./index.js";

export interface MixtureOptions extends ClientOptions {
  /** uidPrefix names the grid: experts are uidPrefix.i.j… ("ffn" or "ffn."). */
  uidPrefix: string;
  /** kBest experts are called per sample; kMin must answer (default 1). */
  kBest: number;
  kMin?: number;
  /** banBase and banMax bound how long a failing server is avoided, in ms: banBase after one failure, doubling up to banMax. Defaults 1000 and 60000. */
  banBase?: number;
  banMax?: number;
  /**
   * trustedPeers, if given (at most 1024 peer ids), pins the servers called:
   * the discovery server's beam search runs over the records signed by these
   * keys alone, so that the kBest experts they host are found however many
   * others score higher, and each endpoint's peer id is checked again here,
   * since the discovery server is not trusted to have filtered.
   */
  trustedPeers?: string[];
}

/** MAX_TRUSTED_PEERS bounds trustedPeers, as the DiscoveryService bounds BeamSearchRequest.peers. */
export const MAX_TRUSTED_PEERS = 1024;

/** KMinNotMetError: fewer than kMin experts of a sample answered. */
export class KMinNotMetError extends Error {}

export class RemoteMixtureOfExperts {
  private readonly prefix: string;
  private readonly discovery;
  private readonly clients = new Map<string, MoehostClient>();
  private readonly bans = new Map<string, { until: number; backoff: number }>();
  private readonly seen = new Map<string, { latency: number; failures: number }>();

  constructor(private readonly opts: MixtureOptions) {
    if (opts.trustedPeers && opts.trustedPeers.length > MAX_TRUSTED_PEERS) {
      throw new RangeError(`moehost: ${opts.trustedPeers.length} trusted peers: want at most ${MAX_TRUSTED_PEERS}`);
    }
    this.prefix = opts.uidPrefix.replace(/\.$/, "");
    this.discovery = createClient(DiscoveryService, createTransport(opts));
  }

  /** banned reports whether the server at url is being avoided. */
  banned(url: string): boolean {
    const b = this.bans.get(url);
    return b !== undefined && Date.now() < b.until;
  }

  /** pick chooses an expert's server: untried first (by claimed load), then fewest failures, then fastest. */
  private pick(eps: Endpoint[]): string | undefined {
    let best: string | undefined;
    let bestKey: number[] | undefined;
    for (const e of eps) {
      if (this.opts.trustedPeers && !this.opts.trustedPeers.includes(e.peerId)) continue;
      if (this.banned(e.url)) continue;
      const s = this.seen.get(e.url);
      const key = s === undefined ? [1, Number(e.queueDepth), 0] : [2, s.failures, s.latency];
      if (bestKey === undefined || key[0] < bestKey[0] || (key[0] === bestKey[0] && (key[1] < bestKey[1] || (key[1] === bestKey[1] && key[2] < bestKey[2])))) {
        best = e.url;
        bestKey = key;
      }
    }
    return best;
  }

  private fail(url: string): void {
    const b = this.bans.get(url);
    const backoff = Math.min(Math.max(2 * (b?.backoff ?? 0), this.opts.banBase ?? 1000), this.opts.banMax ?? 60000);
    this.bans.set(url, { until: Date.now() + backoff, backoff });
    const s = this.seen.get(url) ?? { latency: 0, failures: 0 };
    this.seen.set(url, { latency: s.latency, failures: s.failures + 1 });
  }

  private succeed(url: string, took: number): void {
    this.bans.delete(url);
    const s = this.seen.get(url);
    this.seen.set(url, { latency: s && s.latency > 0 ? 0.3 * took + 0.7 * s.latency : took, failures: 0 });
  }

  private client(url: string): MoehostClient {
    let c = this.clients.get(url);
    if (!c) {
      c = createMoehostClient({ ...this.opts, baseUrl: url });
      this.clients.set(url, c);
    }
    return c;
  }

  /**
   * forward mixes one sample: x is its input row, gridScores[d][i] its gate
   * score of coordinate i in grid dimension d. It returns the mixed output
   * and the uids that answered.
   */
  async forward(x: Float32Array, gridScores: number[][]): Promise<{ output: Float32Array; experts: string[] }> {
    const k = this.opts.kBest;
    const banned = [...this.bans.keys()].filter((u) => this.banned(u)).length;
    const res = await this.discovery.beamSearch({
      prefix: this.prefix,
      gridScores: gridScores.map((values) => ({ values })),
      // Ask for more while servers are banned, so that the next best
      // experts can replace theirs. Untrusted servers need no margin: the
      // search runs over the trusted peers' records alone.
      k: Math.min(k * (1 + banned), 1024),
      peers: this.opts.trustedPeers ?? [],
    });
    const chosen: { uid: string; url: string; score: number }[] = [];
    for (const e of res.experts) {
      if (chosen.length === k) break;
      const url = this.pick(e.endpoints);
      if (url !== undefined) chosen.push({ uid: e.uid, url, score: e.score });
    }
    const kMin = this.opts.kMin ?? 1;
    if (chosen.length < kMin) {
      throw new KMinNotMetError(`moehost: ${chosen.length} experts under ${this.prefix} have a server not banned${this.opts.trustedPeers ? " and trusted" : ""}, kMin is ${kMin}`);
    }
    const input = float32Tensor(x, [1, x.length]);
    const results = await Promise.all(
      chosen.map(async (c) => {
        const begin = Date.now();
        try {
          const [out] = await this.client(c.url).expert(c.uid).forward(input);
          this.succeed(c.url, Date.now() - begin);
          return { c, out: toFloat32Array(out) };
        } catch (err) {
          this.fail(c.url);
          return { c, err };
        }
      }),
    );
    const ok = results.filter((r) => r.out !== undefined) as { c: (typeof chosen)[0]; out: Float32Array }[];
    if (ok.length < kMin) {
      const why = results.filter((r) => r.out === undefined).map((r) => `${r.c.uid} at ${r.c.url}: ${String((r as { err: unknown }).err)}`);
      throw new KMinNotMetError(`moehost: ${ok.length} of ${chosen.length} experts answered, kMin is ${kMin}: ${why.join("; ")}`);
    }
    const top = Math.max(...ok.map((r) => r.c.score));
    const w = ok.map((r) => Math.exp(r.c.score - top));
    const sum = w.reduce((a, b) => a + b, 0);
    const output = new Float32Array(ok[0].out.length);
    ok.forEach((r, j) => r.out.forEach((v, t) => (output[t] += (w[j] / sum) * v)));
    return { output, experts: ok.map((r) => r.c.uid) };
  }
}
