// Exposes one call for web.test.mjs: GetServerInfo and a Forward on the
// first expert, from this page's origin to the server at baseUrl.
import { ConnectError, createMoehostClient, randomInput, shapeOf } from "@moehost/client";

export interface CallResult {
  ok: boolean;
  expertCount?: number;
  shape?: number[];
  error?: string;
}

async function callServer(baseUrl: string, protocol: "connect" | "grpc-web", token?: string): Promise<CallResult> {
  try {
    const client = createMoehostClient({ baseUrl, protocol, token });
    const info = await client.info();
    const { experts } = await client.experts.listExperts({});
    const e = experts[0];
    const [out] = await client.expert(e.uid).forward(randomInput(e.inputs[0], 2));
    return { ok: true, expertCount: info.expertCount, shape: shapeOf(out) };
  } catch (err) {
    return { ok: false, error: err instanceof ConnectError ? err.message : String(err) };
  }
}

declare global {
  interface Window {
    callServer: typeof callServer;
  }
}
window.callServer = callServer;
document.body.dataset.ready = "true";
