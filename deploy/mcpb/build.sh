#!/usr/bin/env bash
# Builds the MCP bundle (.mcpb) the MCP Registry entry (server.json) names: the
# countersign binary (stripped) and manifest.json, validated and packed by the MCPB
# tool (npm @anthropic-ai/mcpb). With --server-json FILE, writes the bundle's SHA-256
# (`fileSha256`, which the registry requires for an mcpb package) and version into FILE.
#
#   cargo build --profile dist -p countersign
#   deploy/mcpb/build.sh target/dist/countersign countersign-0.1.0-x86_64-linux.mcpb --server-json server.json
#
# The MCPB tool is looked for as $MCPB, then in tests/upstreams/node_modules (npm ci
# --prefix tests/upstreams installs it), then on PATH.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
usage() { echo "usage: $0 BINARY OUT.mcpb [--server-json FILE]" >&2; exit 2; }
[ "$#" -ge 2 ] || usage
binary="$1"; out="$2"; shift 2
server_json=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --server-json) [ "$#" -ge 2 ] || usage; server_json="$2"; shift 2 ;;
    *) usage ;;
  esac
done
[ -x "$binary" ] || { echo "build.sh: $binary is not an executable" >&2; exit 2; }
mcpb="${MCPB:-}"
if [ -z "$mcpb" ]; then
  if [ -x "$root/tests/upstreams/node_modules/.bin/mcpb" ]; then
    mcpb="$root/tests/upstreams/node_modules/.bin/mcpb"
  elif command -v mcpb >/dev/null; then
    mcpb="mcpb"
  else
    echo "build.sh: the MCPB tool is missing: npm ci --prefix tests/upstreams (or set MCPB)" >&2
    exit 2
  fi
fi
# The version is the binary's own: `countersign 0.1.0`.
version="$("$binary" --version | awk '{print $2}')"
[ -n "$version" ] || { echo "build.sh: $binary --version printed no version" >&2; exit 2; }

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/server"
python3 - "$here/manifest.json" "$stage/manifest.json" "$version" <<'PY'
import json, sys
manifest = json.load(open(sys.argv[1], encoding="utf-8"))
manifest["version"] = sys.argv[3]
json.dump(manifest, open(sys.argv[2], "w", encoding="utf-8"), indent=2)
PY
# Symbols are not shipped (the dist profile strips them already; a debug build's are
# hundreds of megabytes).
strip -o "$stage/server/countersign" "$binary"
chmod 755 "$stage/server/countersign"
"$mcpb" validate "$stage/manifest.json"
"$mcpb" pack "$stage" "$out" >/dev/null
sha="$(sha256sum "$out" | awk '{print $1}')"
echo "build.sh: $out: countersign $version, $(stat -c %s "$out") bytes, sha256 $sha"
if [ -n "$server_json" ]; then
  python3 - "$server_json" "$sha" "$version" <<'PY'
import json, sys
path, sha, version = sys.argv[1:4]
doc = json.load(open(path, encoding="utf-8"))
bundles = [p for p in doc.get("packages", []) if p.get("registryType") == "mcpb"]
if len(bundles) != 1:
    sys.exit(f"build.sh: {path} has {len(bundles)} mcpb packages, expected one")
bundles[0]["fileSha256"] = sha
bundles[0]["version"] = version
with open(path, "w", encoding="utf-8") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
print(f"build.sh: {path}: fileSha256 {sha}")
PY
fi
