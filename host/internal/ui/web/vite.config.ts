import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

// The dashboard is served by moehost under /ui/ and built into ../dist,
// which package ui embeds. The client package's source is compiled in
// directly; its dependencies resolve from here, once.
export default defineConfig({
  base: "/ui/",
  resolve: {
    alias: {
      "@moehost/client": fileURLToPath(new URL("../../../../sdk/ts/src/index.ts", import.meta.url)),
    },
    dedupe: ["@bufbuild/protobuf", "@connectrpc/connect", "@connectrpc/connect-web"],
  },
  build: {
    outDir: "../dist",
    emptyOutDir: true,
    target: "es2022",
    reportCompressedSize: false,
  },
  server: {
    // `npm run dev` proxies the API to a local `moehost serve`.
    proxy: { "/moehost.v1.": "http://127.0.0.1:7700" },
  },
});
