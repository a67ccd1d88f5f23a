#!/usr/bin/env bash
# Regenerate grafana/dashboard.schema.json from Grafana's own TypeScript types (needs node + npm and
# the npm registry; CI does not run this, it uses the committed file).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
GEN=$(mktemp -d)
trap 'rm -rf "$GEN"' EXIT
cd "$GEN"
echo '{"private":true}' > package.json
npm install --no-audit --no-fund @grafana/schema@13.2.3 ts-json-schema-generator@2.4.0 typescript >/dev/null
npx ts-json-schema-generator --no-type-check --type Dashboard \
  --path node_modules/@grafana/schema/dist/types/raw/dashboard/x/types.gen.d.ts -o dashboard.schema.json
grep -q 'schemaVersion: 42' node_modules/@grafana/schema/dist/esm/index-*.js \
  || echo "warning: @grafana/schema's defaultDashboard no longer says schemaVersion 42; update grafana/build.py" >&2
python3 - "$GEN/dashboard.schema.json" "$HERE/dashboard.schema.json" <<'PY'
import json, sys
src, dst = sys.argv[1], sys.argv[2]
comment = json.load(open(dst))["$comment"] if __import__("os").path.exists(dst) else ""
out = {"$comment": comment}
out.update(json.load(open(src)))
with open(dst, "w") as f:
    json.dump(out, f, indent=2)
    f.write("\n")
PY
echo "wrote $HERE/dashboard.schema.json"
