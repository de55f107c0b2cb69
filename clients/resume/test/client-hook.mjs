// Module resolution hook: `@ag-ui/client` resolves to the package named in `initialize`'s
// data (the test runs once per official client version; see client.mjs).
let target = "@ag-ui/client";

export function initialize(data) {
  target = data.target;
}

export function resolve(specifier, context, next) {
  return next(specifier === "@ag-ui/client" ? target : specifier, context);
}
