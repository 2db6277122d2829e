#!/bin/sh
# Runs the pytest tests of one folder (ctest: export_pytest, bridge_pytest).
#   tests/run_pytest.sh DIR "MODULES"
# Uses $KS_PYTHON, else python3, else /usr/bin/python3: the first that imports
# every one of MODULES (e.g. "pytest torch"). Exit 77 (ctest: skipped) when none does.
dir=$1
modules=${2:-pytest}
imports=$(echo "$modules" | sed 's/ \+/, /g')
for py in "$KS_PYTHON" python3 /usr/bin/python3; do
  [ -n "$py" ] || continue
  if "$py" -c "import $imports" >/dev/null 2>&1; then
    PYTHONDONTWRITEBYTECODE=1 exec "$py" -m pytest -p no:cacheprovider -rs -q "$dir"
  fi
done
echo "SKIP: no python3 that imports $imports (tried \$KS_PYTHON, python3, /usr/bin/python3); apt install python3-pytest python3-torch" >&2
exit 77
