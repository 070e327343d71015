import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

// Builds the cross-origin page: the TypeScript client (from its source in
// sdk/ts) on a page that web.test.mjs serves from origins other than the
// server's.
export default defineConfig({
  resolve: {
    alias: {
      "@moehost/client": fileURLToPath(new URL("../../sdk/ts/src/index.ts", import.meta.url)),
    },
    dedupe: ["@bufbuild/protobuf", "@connectrpc/connect", "@connectrpc/connect-web"],
  },
  build: {
    outDir: "dist",
    emptyOutDir: true,
    target: "es2022",
    reportCompressedSize: false,
    rollupOptions: { input: fileURLToPath(new URL("crossorigin.html", import.meta.url)) },
  },
});
