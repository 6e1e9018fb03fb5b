#!/usr/bin/env bash
# Makes .venv (or $LOOPS_MOCK_VENV) with the Python packages of client-tests/requirements.txt:
# the real client libraries (requests, httpx, huggingface_hub, transformers) the tests drive.
# Done once; again only when the requirements change. Offline machines whose pip is set up
# with local wheel folders or file:// indexes (pip config list) install from those alone, so
# pip never waits on an index it cannot reach; elsewhere pip uses its usual index.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${LOOPS_MOCK_VENV:-.venv}"
requirements=client-tests/requirements.txt
want="$(sha256sum "$requirements" | cut -d' ' -f1)"
stamp="$venv/.requirements.sha256"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

python=${PYTHON:-python3}
command -v "$python" >/dev/null || { echo "scripts/python-venv.sh: $python not found; install Python 3.10+ (Debian: apt-get install python3 python3-venv)" >&2; exit 1; }
rm -rf "$venv"
"$python" -m venv "$venv" || { echo "scripts/python-venv.sh: '$python -m venv' failed; on Debian install python3-venv" >&2; exit 1; }

# Local package sources from pip's configuration (files, environment variables).
find_links=()
indexes=()
while IFS= read -r line; do
  key="${line%%=*}"
  value="${line#*=}"
  value="${value#\'}"
  value="${value%\'}"
  for item in $value; do
    case "$key" in
      *find-links) find_links+=("$item") ;;
      *index-url) case "$item" in file://*) indexes+=("$item") ;; esac ;;
    esac
  done
done < <("$venv/bin/pip" config list 2>/dev/null || true)

args=(--disable-pip-version-check --quiet)
if [ ${#indexes[@]} -gt 0 ]; then
  # A local index replaces the default one: nothing is fetched from the network.
  args+=(--index-url "${indexes[0]}")
  for index in "${indexes[@]:1}"; do args+=(--extra-index-url "$index"); done
  for folder in "${find_links[@]}"; do args+=(--find-links "$folder"); done
elif [ ${#find_links[@]} -gt 0 ]; then
  args+=(--no-index)
  for folder in "${find_links[@]}"; do args+=(--find-links "$folder"); done
fi

echo "scripts/python-venv.sh: installing client-tests/requirements.txt into $venv" >&2
# A configured index without some package's folder makes pip warn once per package: not news.
"$venv/bin/pip" install "${args[@]}" -r "$requirements" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
echo "$want" > "$stamp"
