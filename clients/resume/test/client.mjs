// Loaded with `node --import ./test/client.mjs`: `@ag-ui/client`, in the package as in the
// test, is the version AGUI_CLIENT names: 1.0.0 (the dev dependency) or 0.0.59 (installed
// as `agui-client-0`).
import { register } from "node:module";

const targets = { "1.0.0": "@ag-ui/client", "0.0.59": "agui-client-0" };
const target = targets[process.env.AGUI_CLIENT];
if (!target) {
  console.error(`AGUI_CLIENT must be one of ${Object.keys(targets).join(", ")}`);
  process.exit(2);
}
register("./client-hook.mjs", import.meta.url, { data: { target } });
