"""The child process of process.py: builds the recipe it is given and leaves the passes, or the error, for it."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

from edgefleet.converter.generative.builders.recipes import BuildOrder, run_recipe


def main(order: Path, answer: Path) -> int:
    build = pickle.loads(order.read_bytes())
    assert isinstance(build, BuildOrder), type(build)
    try:
        result: tuple[str, object] = ("ok", run_recipe(build))
    except Exception as err:  # sent back: the converter records it as the build's failure, the others go on
        result = ("error", str(err) or type(err).__name__)
    partial = answer.with_name(answer.name + ".tmp")
    partial.write_bytes(pickle.dumps(result))
    partial.replace(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
