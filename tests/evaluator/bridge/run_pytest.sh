#!/bin/sh
# Runs the pytest tests of the reference bridge's Python (ctest: bridge_pytest).
# Uses $KS_PYTHON, else python3, else /usr/bin/python3: the first that imports
# pytest and torch. Exit 77 (ctest: skipped) when none does.
here=$(cd "$(dirname "$0")" && pwd)
for py in "$KS_PYTHON" python3 /usr/bin/python3; do
  [ -n "$py" ] || continue
  if "$py" -c "import pytest, torch" >/dev/null 2>&1; then
    PYTHONDONTWRITEBYTECODE=1 exec "$py" -m pytest -p no:cacheprovider -rs -q "$here"
  fi
done
echo "SKIP: no python3 that imports pytest and torch (tried \$KS_PYTHON, python3, /usr/bin/python3)" >&2
exit 77
