#!/usr/bin/env python3
"""Which torch this interpreter has (evaluator/problem.cc, ResolvePython).

  probe.py              imports torch; prints {"torch", "cuda", "device"} as JSON
  probe.py --installed  exits 0 when torch can be found, 1 when not, without
                        importing it (importing torch costs a second or more)
"""
import json
import sys


def main(argv):
    if argv[1:] == ["--installed"]:
        import importlib.util
        return 0 if importlib.util.find_spec("torch") else 1
    import torch
    cuda = bool(torch.cuda.is_available())
    print(json.dumps({"torch": torch.__version__, "cuda": cuda,
                      "device": torch.cuda.get_device_name(0) if cuda else "cpu"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
