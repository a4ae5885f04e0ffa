// Builds every view (src/views/<name>.html) into one self-contained HTML file, <out>/dist/<name>.html (and
// the web view's host script, <out>/dist/web-host.js):
// script and style inlined (vite-plugin-singlefile), nothing fetched at run time. The test-only pages
// (test/<name>.html: the MCP Apps host of tests/e2e/test_views.py) go to <out>/test/. One Vite build per
// entry: a single-file bundle has one input. Usage: node build.mjs [--out DIR] (default: this directory).
import { readdirSync, statSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "vite";
import { viteSingleFile } from "vite-plugin-singlefile";

const here = dirname(fileURLToPath(import.meta.url));
const at = process.argv.indexOf("--out");
const out = resolve(at >= 0 ? process.argv[at + 1] : here);
const MAX_BYTES = 300 * 1024;

async function buildDir(source, target) {
  const root = join(here, source);
  for (const name of readdirSync(root).filter((n) => n.endsWith(".html")).sort()) {
    await build({
      root,
      logLevel: "warn",
      configFile: false,
      base: "./",
      plugins: [viteSingleFile({ removeViteModuleLoader: true })],
      build: { outDir: join(out, target), emptyOutDir: false, target: "es2022", rollupOptions: { input: join(root, name) } },
    });
    const size = statSync(join(out, target, name)).size;
    if (size > MAX_BYTES) throw new Error(`${target}/${name} is ${size} bytes, over ${MAX_BYTES}`);
    console.log(`${target}/${name} ${size} bytes`);
  }
}

// The web view's host (/ui/host.js, daemon/server/ui/web.py): one script file, loaded by the page under its
// CSP (script-src 'self'), which shows these views for the calls it lists.
async function buildWebHost() {
  await build({
    root: here,
    logLevel: "warn",
    configFile: false,
    build: {
      outDir: join(out, "dist"), emptyOutDir: false, target: "es2022",
      lib: { entry: join(here, "src/web-host/host.ts"), formats: ["iife"], name: "diagdWebHostBundle",
             fileName: () => "web-host.js" },
    },
  });
  const size = statSync(join(out, "dist", "web-host.js")).size;
  if (size > MAX_BYTES) throw new Error(`dist/web-host.js is ${size} bytes, over ${MAX_BYTES}`);
  console.log(`dist/web-host.js ${size} bytes`);
}

await buildDir("src/views", "dist");
await buildWebHost();
await buildDir("test", "test");
