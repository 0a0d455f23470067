# Sourced by tools/ember and tools/test: make (once) and activate the project's virtual environment.
# Ember needs Python >= 3.12 (jax 0.11.2); use python3.12 from PATH or from pyenv.
set -euo pipefail
EMBER_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EMBER_VENV="${EMBER_VENV:-$EMBER_ROOT/.venv}"

find_python() {
  for candidate in python3.13 python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && \
       "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      command -v "$candidate"; return
    fi
  done
  if command -v pyenv >/dev/null 2>&1; then
    local version
    # Prefer 3.12 (what jax 0.11.2 is built and tested for here), else the newest 3.13+.
    version="$(pyenv versions --bare | grep -E '^3\.12(\.[0-9]+)?$' | sort -V | tail -1 || true)"
    [ -n "$version" ] || version="$(pyenv versions --bare | grep -E '^3\.1[3-9](\.[0-9]+)?$' | sort -V | tail -1 || true)"
    if [ -n "$version" ]; then
      echo "$(pyenv root)/versions/$version/bin/python${version%.*}"; return
    fi
  fi
  echo "ember: Python >= 3.12 not found (install it, e.g. 'pyenv install 3.12')" >&2
  exit 1
}

# Reinstall when pyproject.toml changes.
stamp="$EMBER_VENV/.ember-installed"
if [ ! -x "$EMBER_VENV/bin/python" ] || [ ! -f "$stamp" ] || [ "$EMBER_ROOT/pyproject.toml" -nt "$stamp" ]; then
  python="$(find_python)"
  echo "ember: setting up $EMBER_VENV with $python" >&2
  "$python" -m venv "$EMBER_VENV"
  "$EMBER_VENV/bin/python" -m pip install --quiet --upgrade pip >&2
  "$EMBER_VENV/bin/python" -m pip install --quiet -e "$EMBER_ROOT[test]" >&2
  touch "$stamp"
fi
export PATH="$EMBER_VENV/bin:$PATH"
