"""`python engine_driver.py JOB.json RESULT.json`: tests/runtime/sglang_engine/driver.py (one SGLang Engine
launch, its greedy outputs as JSON; the job format is documented there), run from this directory so that this
directory, not the CPU test's, is the script's sys.path[0]: its `sgl_kernel` (the GPU stand-in) and
sitecustomize.py are the ones SGLang's processes find."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DRIVER = Path(__file__).resolve().parents[2] / "tests" / "runtime" / "sglang_engine" / "driver.py"


def main() -> None:
    spec = importlib.util.spec_from_file_location("ddtree_engine_driver", DRIVER)
    assert spec is not None and spec.loader is not None
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    driver.main()


if __name__ == "__main__":
    main()
