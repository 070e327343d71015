// @moehost/client calls moehost expert servers from browsers and Node.js
// (20 or later) over Connect or gRPC-Web, with the fetch API.
import { create } from "@bufbuild/protobuf";
import { createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-web";

import { ExpertService, type ExpertInfo } from "./gen/moehost/v1/expert_pb.js";
import { ServerService, type GetServerInfoResponse } from "./gen/moehost/v1/server_pb.js";
import { DType, type Tensor, type TensorSchema } from "./gen/moehost/v1/tensor_pb.js";
import { decodeHalf, encodeHalf, isHalf } from "./half.js";

export * from "./gen/moehost/v1/checkpoint_pb.js";
export * from "./gen/moehost/v1/discovery_pb.js";
export * from "./gen/moehost/v1/expert_pb.js";
export * from "./gen/moehost/v1/server_pb.js";
export * from "./gen/moehost/v1/tensor_pb.js";
export { ConnectError, Code } from "@connectrpc/connect";
export { bfloat16Bits, bfloat16Value, decodeHalf, encodeHalf, float16Bits, float16Value, isHalf } from "./half.js";

/** Options of {@link createMoehostClient}. */
export interface ClientOptions {
  /**
   * Server address with scheme, e.g. "http://127.0.0.1:7700", or
   * "https://host:7700" for a server with `--tls-cert`. Browsers check the
   * certificate against their own roots; Node.js against its bundled ones
   * and, for a private CA, the PEM file that NODE_EXTRA_CA_CERTS names
   * (read once, when node starts).
   */
  baseUrl: string;
  /** Wire protocol: "connect" (default) or "grpc-web". */
  protocol?: "connect" | "grpc-web";
  /**
   * Bearer token sent as the Authorization header of every call: a
   * tenant's (`moehost tenant add`), with which it may train its own
   * experts, or the server's admin token. Default: $MOEHOST_TOKEN where
   * there is a process environment (Node.js), else none; "" sends none.
   */
  token?: string;
  /** A fetch to use instead of the global one. */
  fetch?: typeof globalThis.fetch;
  /**
   * Dtype that float32 tensors travel in, both ways, through
   * {@link MoehostClient.expert}: DType.DTYPE_FLOAT16 or DTYPE_BFLOAT16
   * halve the bytes of every call, at the format's precision (float16: 11
   * significant bits, range ±65504; bfloat16: 8 bits, float32's range).
   * Callers still pass and get float32 tensors; the server computes in
   * float32. DTYPE_FLOAT32 (the default) sends float32; any other dtype
   * throws in createMoehostClient. Like Go's client.WithWireDType.
   */
  wireDType?: DType;
}

/** A client of one moehost server: its two services, and one helper per expert. */
export interface MoehostClient {
  /** ExpertService: Forward, Backward, Info, ListExperts. */
  readonly experts: Client<typeof ExpertService>;
  /** ServerService: GetServerInfo. */
  readonly server: Client<typeof ServerService>;
  /** expert returns a helper for the expert with the given uid. */
  expert(uid: string): RemoteExpert;
  /** info returns the server's description. */
  info(): Promise<GetServerInfoResponse>;
}

/**
 * One remote expert: float32 tensors in, float32 tensors out (converted
 * to and from the client's wireDType on the wire).
 */
export interface RemoteExpert {
  readonly uid: string;
  /** forward runs the expert on one batch and returns its outputs. */
  forward(...inputs: Tensor[]): Promise<Tensor[]>;
  /** backward sends inputs and output gradients; the server trains one step. */
  backward(inputs: Tensor[], gradOutputs: Tensor[]): Promise<Tensor[]>;
  /** info describes the expert: schema, digest, health, load. */
  info(): Promise<ExpertInfo>;
}

/** createTransport returns the fetch-based transport the client uses. */
export function createTransport(opts: ClientOptions): Transport {
  const interceptors: Interceptor[] = [];
  const token = (opts.token ?? envToken()).trim();
  if (token) {
    const auth = `Bearer ${token}`;
    interceptors.push((next) => (req) => {
      req.header.set("Authorization", auth);
      return next(req);
    });
  }
  const common = {
    baseUrl: opts.baseUrl,
    useBinaryFormat: true, // tensors are bytes: JSON would base64 them
    interceptors,
    fetch: opts.fetch,
  };
  return opts.protocol === "grpc-web" ? createGrpcWebTransport(common) : createConnectTransport(common);
}

/** TOKEN_ENV names the environment variable that holds the default token. */
export const TOKEN_ENV = "MOEHOST_TOKEN";

/** envToken returns $MOEHOST_TOKEN, or "" where there is none (or no process, as in a browser). */
function envToken(): string {
  const proc = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  return proc?.env?.[TOKEN_ENV] ?? "";
}

/** createMoehostClient returns a client of the server at opts.baseUrl. */
export function createMoehostClient(opts: ClientOptions): MoehostClient {
  const wire = opts.wireDType ?? DType.DTYPE_FLOAT32;
  if (wire !== DType.DTYPE_FLOAT32 && !isHalf(wire)) {
    throw new RangeError(`wireDType ${DType[wire] ?? wire}: want DTYPE_FLOAT32, DTYPE_FLOAT16 or DTYPE_BFLOAT16`);
  }
  const transport = createTransport(opts);
  const experts = createClient(ExpertService, transport);
  const server = createClient(ServerService, transport);
  return {
    experts,
    server,
    info: () => server.getServerInfo({}),
    expert(uid: string): RemoteExpert {
      return {
        uid,
        forward: async (...inputs) =>
          fromWire((await experts.forward({ uid, inputs: toWire(inputs, wire), outputDtype: wire })).outputs),
        backward: async (inputs, gradOutputs) =>
          fromWire(
            (
              await experts.backward({
                uid,
                inputs: toWire(inputs, wire),
                gradOutputs: toWire(gradOutputs, wire),
                gradInputDtype: wire,
              })
            ).gradInputs,
          ),
        info: () => experts.info({ uid }),
      };
    },
  };
}

/**
 * toWire converts float32 tensors to the wire dtype; others, and tensors
 * whose bytes do not hold float32s (the server says what is wrong with
 * those), go as they are.
 */
function toWire(ts: Tensor[], wire: DType): Tensor[] {
  if (!isHalf(wire)) return ts;
  return ts.map((t) =>
    t.dtype === DType.DTYPE_FLOAT32 && t.data.length % 4 === 0
      ? { ...t, dtype: wire, data: encodeHalf(wire, toFloat32Array(t)) }
      : t,
  );
}

/** fromWire widens 16-bit float tensors to float32, so callers get what they would without wireDType. */
function fromWire(ts: Tensor[]): Tensor[] {
  return ts.map((t) => (isHalf(t.dtype) ? float32Tensor(decodeHalf(t.dtype, t.data), shapeOf(t)) : t));
}

/** float32Tensor wraps values as a float32 Tensor of the given shape. */
export function float32Tensor(values: Float32Array | number[], shape: number[]): Tensor {
  const v = values instanceof Float32Array ? values : Float32Array.from(values);
  const n = shape.reduce((a, b) => a * b, 1);
  if (n !== v.length) {
    throw new RangeError(`shape [${shape}] holds ${n} values, got ${v.length}`);
  }
  const data = new Uint8Array(v.length * 4);
  const view = new DataView(data.buffer);
  v.forEach((x, i) => view.setFloat32(i * 4, x, true));
  return { $typeName: "moehost.v1.Tensor", dtype: DType.DTYPE_FLOAT32, shape: shape.map(BigInt), data };
}

/** toFloat32Array reads a float32 Tensor's values (little-endian on the wire). */
export function toFloat32Array(t: Tensor): Float32Array {
  if (t.dtype !== DType.DTYPE_FLOAT32) {
    throw new TypeError(`tensor dtype is ${DType[t.dtype]}, want DTYPE_FLOAT32`);
  }
  if (t.data.length % 4 !== 0) {
    throw new RangeError(`float32 tensor has ${t.data.length} bytes, not a multiple of 4`);
  }
  const view = new DataView(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  const out = new Float32Array(t.data.length / 4);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(i * 4, true);
  return out;
}

/** shapeOf returns a tensor's shape as numbers. */
export function shapeOf(t: Tensor): number[] {
  return t.shape.map(Number);
}

/**
 * randomInput returns a float32 tensor for a schema, with `batch` rows
 * in place of its batch dimension (-1), of standard normal values.
 */
export function randomInput(schema: TensorSchema, batch: number): Tensor {
  if (schema.dtype !== DType.DTYPE_FLOAT32) {
    throw new TypeError(`input ${schema.name} is ${DType[schema.dtype]}; only DTYPE_FLOAT32 inputs can be made`);
  }
  const shape = schema.shape.map((d) => (d < 0n ? batch : Number(d)));
  const n = shape.reduce((a, b) => a * b, 1);
  const v = new Float32Array(n);
  for (let i = 0; i < n; i += 2) {
    // Box-Muller: two normal values from two uniform ones.
    const u = 1 - Math.random();
    const r = Math.sqrt(-2 * Math.log(u));
    const a = 2 * Math.PI * Math.random();
    v[i] = r * Math.cos(a);
    if (i + 1 < n) v[i + 1] = r * Math.sin(a);
  }
  return float32Tensor(v, shape);
}

/** Summary statistics of a tensor's values. */
export interface Stats {
  count: number;
  mean: number;
  std: number;
  min: number;
  max: number;
}

/** stats returns the count, mean, standard deviation, min and max of values. */
export function stats(values: Float32Array): Stats {
  let sum = 0;
  let min = Infinity;
  let max = -Infinity;
  for (const x of values) {
    sum += x;
    if (x < min) min = x;
    if (x > max) max = x;
  }
  const mean = values.length ? sum / values.length : NaN;
  let sq = 0;
  for (const x of values) sq += (x - mean) * (x - mean);
  return { count: values.length, mean, std: values.length ? Math.sqrt(sq / values.length) : NaN, min, max };
}
export { RemoteMixtureOfExperts, KMinNotMetError, MAX_TRUSTED_PEERS, type MixtureOptions } from "./moe.js";
