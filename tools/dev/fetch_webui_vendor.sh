#!/usr/bin/env bash
# Re-fetch the web chat page's libraries (server/webui/vendor/) from npm at their pinned versions, each
# with its license beside it, and record name, version and npm integrity in vendor/manifest.json.
# Nothing is built: the files are the packages' own browser builds, served as they are.
#   tools/dev/fetch_webui_vendor.sh     (needs npm; run after changing a version below, then commit)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENDOR="$ROOT/server/webui/vendor"
# package@version  name-under-vendor  files to keep (paths inside the package)
PACKAGES=(
  "marked@18.3.0 marked lib/marked.umd.js LICENSE"
  "dompurify@3.5.0 dompurify dist/purify.min.js LICENSE"
  "@highlightjs/cdn-assets@11.12.0 highlight highlight.min.js styles/github-dark.min.css LICENSE"
)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rm -rf "$VENDOR"
mkdir -p "$VENDOR"
manifest="["
for entry in "${PACKAGES[@]}"; do
  read -r spec name files <<<"$entry"
  (cd "$work" && npm pack --silent --json "$spec" >"$name.json")
  tarball="$work/$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["filename"])' "$work/$name.json")"
  mkdir -p "$work/$name" "$VENDOR/$name"
  tar xzf "$tarball" -C "$work/$name"
  kept=()
  for file in $files; do
    cp "$work/$name/package/$file" "$VENDOR/$name/$(basename "$file")"
    kept+=("\"$(basename "$file")\"")
  done
  integrity="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["integrity"])' "$work/$name.json")"
  version="${spec##*@}"
  package="${spec%@*}"
  manifest+="{\"name\": \"$name\", \"package\": \"$package\", \"version\": \"$version\", \"integrity\": \"$integrity\", \"files\": [$(IFS=,; echo "${kept[*]}")]},"
done
python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1].rstrip(",") + "]"), indent=2))' "$manifest" \
  >"$VENDOR/manifest.json"
echo "vendored into $VENDOR:"
cat "$VENDOR/manifest.json"
