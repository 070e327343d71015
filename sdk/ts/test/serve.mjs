// startServer runs `moehost serve` on a free loopback port and resolves
// with its base URL (https:// when it serves TLS; and its DHT node's peer
// id and multiaddrs, from its log) once it serves; stop() ends it. The
// binary comes from $MOEHOST_BIN (make test-ts builds it).
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/**
 * makeCA writes a CA made now, a server pair for 127.0.0.1 and localhost
 * and a client pair into a temp dir (internal/cmd/testca: $MOEHOST_TESTCA,
 * which make test-ts and test-web build, else `go run` in the checkout),
 * and returns their paths, the server certificate's SPKI hash, and
 * remove().
 */
export function makeCA() {
  const dir = mkdtempSync(join(tmpdir(), "moehost-ca-"));
  const root = fileURLToPath(new URL("../../..", import.meta.url));
  const bin = process.env.MOEHOST_TESTCA;
  if (bin) execFileSync(bin, [dir]);
  else execFileSync("go", ["run", "./internal/cmd/testca", dir], { cwd: root });
  return {
    dir,
    ca: join(dir, "ca.pem"),
    cert: join(dir, "server.pem"),
    key: join(dir, "server-key.pem"),
    spki: readFileSync(join(dir, "server.spki"), "utf8").trim(),
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}

export async function startServer(args = []) {
  const bin = process.env.MOEHOST_BIN;
  if (!bin) throw new Error("set MOEHOST_BIN to a moehost binary (make test-ts does)");
  const dataDir = mkdtempSync(join(tmpdir(), "moehost-ts-"));
  const proc = spawn(bin, ["serve", "--listen", "127.0.0.1:*", "--data-dir", dataDir, ...args], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  let log = "";
  const addr = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`moehost did not start in 120s:\n${log}`)), 120_000);
    proc.stderr.setEncoding("utf8");
    proc.stderr.on("data", (chunk) => {
      log += chunk;
      // The whole line, so that its address and tls= are in.
      const m = /moehost serving.* addr=(\S+).*\n/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    proc.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`moehost exited with ${code}:\n${log}`));
    });
  });
  // The DHT node's id and multiaddrs, as the server logs them ("" and []
  // with --no-dht).
  const dht = /msg="dht node up" peer=(\S+) addrs=(\S+)/.exec(log);
  const tls = /msg="moehost serving".* tls=true/.test(log);
  return {
    baseUrl: `${tls ? "https" : "http"}://${addr}`,
    addr,
    peerId: dht?.[1] ?? "",
    dhtAddrs: dht ? dht[2].split(",") : [],
    kill(signal) {
      proc.kill(signal);
    },
    async stop() {
      proc.removeAllListeners("exit");
      if (proc.exitCode !== null || proc.signalCode !== null) {
        rmSync(dataDir, { recursive: true, force: true });
        return;
      }
      const exited = new Promise((r) => proc.once("exit", r));
      proc.kill("SIGTERM");
      await exited;
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}
