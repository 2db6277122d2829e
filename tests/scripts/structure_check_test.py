#!/usr/bin/env python3
"""scripts/structure_check.py fails on an over-long function or file and passes otherwise.

Each case writes a small tree into a temporary folder and runs the script on it
with the limits the ctest `structure_check` uses (120 lines a function, 700 a file).
"""
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "structure_check.py"


def cxx_function(name, body_lines, indent=""):
    body = "".join(f"{indent}  x += {i};\n" for i in range(body_lines))
    return f"{indent}int {name}(int x) {{\n{body}{indent}  return x;\n{indent}}}\n"


class StructureCheckTest(unittest.TestCase):
    def run_on(self, files):
        with tempfile.TemporaryDirectory() as tmp:
            root = pathlib.Path(tmp) / "lib"
            for name, text in files.items():
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_text(text)
            done = subprocess.run([sys.executable, str(SCRIPT), "--max-function", "120", "--max-file", "700",
                                   str(root)], capture_output=True, text=True)
            return done.returncode, done.stdout

    def test_short_functions_and_files_pass(self):
        rc, out = self.run_on({"ok.cc": cxx_function("Short", 100) + cxx_function("AlsoShort", 117),
                               "ok.py": "def f():\n" + "    x = 1\n" * 100})
        self.assertEqual(rc, 0, out)
        self.assertIn("nothing over the limits", out)

    def test_long_function_fails(self):
        # 118 body lines + head, return and brace: 121 lines.
        rc, out = self.run_on({"a/long.cc": "namespace ks {\n\n" + cxx_function("TooLong", 118) + "\n}  // namespace ks\n"})
        self.assertEqual(rc, 1, out)
        self.assertIn("TooLong is 121 lines", out)

    def test_long_member_defined_in_a_class_fails(self):
        text = "class Foo {\n public:\n" + cxx_function("Method", 130, indent="  ") + "};\n"
        rc, out = self.run_on({"foo.h": text})
        self.assertEqual(rc, 1, out)
        self.assertIn("Method is 133 lines", out)

    def test_multi_line_signature_and_lambda_count_as_one_function(self):
        body = "".join(f"    x += {i};\n" for i in range(120))
        text = ("StatusOr<int> Foo::Run(int x,\n                          int y) const {\n"
                "  auto step = [&](int v) {\n" + body + "    return v;\n  };\n  return step(x + y);\n}\n")
        rc, out = self.run_on({"run.cc": text})
        self.assertEqual(rc, 1, out)
        self.assertIn("run.cc:1: Run is 127 lines", out)
        self.assertNotIn("step", out)

    def test_long_file_fails_even_when_its_top_says_why(self):
        text = "// This file is long, and here is why.\n" + "".join(cxx_function(f"F{i}", 5) for i in range(90))
        rc, out = self.run_on({"big.cc": text})
        self.assertEqual(rc, 1, out)
        self.assertIn("big.cc: 721 lines (limit 700)", out)

    def test_long_python_function_fails(self):
        rc, out = self.run_on({"tool.py": "def slow():\n" + "    x = 1\n" * 130})
        self.assertEqual(rc, 1, out)
        self.assertIn("slow is 131 lines", out)


if __name__ == "__main__":
    unittest.main()
