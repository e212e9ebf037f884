#!/usr/bin/env bash
# The README's two commands: `bash dev.sh demo` and `bash dev.sh test`.
# Both work on a fresh machine with only Python 3.11 and pip: they create .venv first.
set -euo pipefail
cd "$(dirname "$0")"

PY=${PYTHON:-python3}
VENV=.venv

setup() {
    if [ ! -x "$VENV/bin/python" ]; then
        "$PY" -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$VENV/bin/python" -m pip install -q -e ".[test]"
}

need_redis() {
    # The redis state driver is tested against a real redis-server (Debian package).
    if ! command -v redis-server >/dev/null 2>&1; then
        echo "dev.sh: installing redis-server (Debian package) for the redis driver's tests" >&2
        if [ "$(id -u)" = 0 ]; then
            (apt-get update -qq && apt-get install -y -qq redis-server) >/dev/null 2>&1 || true
        else
            (sudo apt-get update -qq && sudo apt-get install -y -qq redis-server) >/dev/null 2>&1 || true
        fi
    fi
}

case "${1:-}" in
    demo)
        shift
        setup
        exec "$VENV/bin/gridgate" demo "$@"
        ;;
    test)
        shift
        setup
        need_redis
        "$VENV/bin/ruff" check core plugins tests bench
        exec "$VENV/bin/python" -m pytest -n 2 -q "$@"
        ;;
    *)
        echo "usage: bash dev.sh demo | bash dev.sh test [pytest args]" >&2
        exit 64
        ;;
esac
