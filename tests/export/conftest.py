"""pytest for export/ (the Python files `kernelsearch export` writes).

EXPORT_DIR is the source tree's export/ (or $KS_EXPORT_DIR); render() fills
kernel_module.py's placeholders by the two rules of search/export.cc's
RenderModuleTemplate, so that the template can be imported and tested here.
"""
import json
import os
import pathlib
import re
import sys

EXPORT_DIR = pathlib.Path(os.environ.get("KS_EXPORT_DIR") or pathlib.Path(__file__).resolve().parents[2] / "export")
sys.path.insert(0, str(EXPORT_DIR))


def render(template, values):
    """"@@NAME@@" in quotes becomes a Python string literal of the value; a bare
    @@NAME@@ (in the docstring) the value as plain text."""
    def fill(m):
        value = values[m.group(2)]
        return json.dumps(value) if m.group(1) else value.replace('"', " ").replace("\\", " ").replace("\n", " ")
    return re.sub(r'("?)@@([A-Z_]+)@@\1', fill, template)
