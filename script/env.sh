# Sourced by the scripts: PY is the project's Python, the one of .venv (script/bootstrap makes
# it), or $HOTSWITCH_VENV's.
VENV="${HOTSWITCH_VENV:-.venv}"
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "$(basename "$0"): no $PY; run script/bootstrap first" >&2; exit 1; }
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
