"""Regenerate the gRPC code in this package from ``protos/``.

    python -m fedpenalty.proto.generate            # rewrite fedpenalty/proto/*_pb2*.py(i)
    python -m fedpenalty.proto.generate --out DIR  # write into DIR instead (the freshness test)

protoc (from grpcio-tools) writes ``fedpenalty/v1/owner_pb2*.py``; the files are moved into
this one package and the generated absolute import is made relative, so the protocol's
descriptor keeps its name ``fedpenalty/v1/owner.proto`` while the code lives here.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PROTO_ROOT = PACKAGE_DIR.parent.parent / "protos"
PROTOS = ("fedpenalty/v1/owner.proto",)
_ABSOLUTE_IMPORT = re.compile(r"^from fedpenalty\.v1 import (\w+_pb2)", re.MULTILINE)


def generated_files(proto_root: Path = PROTO_ROOT) -> dict[str, str]:
    """File name → content of the generated code for every proto in ``PROTOS``."""
    from grpc_tools import protoc

    include = Path(protoc.__file__).resolve().parent / "_proto"
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for proto in PROTOS:
            args = [
                "protoc",
                f"-I{proto_root}",
                f"-I{include}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                str(proto_root / proto),
            ]
            if protoc.main(args) != 0:
                raise RuntimeError(f"protoc failed on {proto}")
            for path in sorted((Path(tmp) / Path(proto).parent).iterdir()):
                out[path.name] = _ABSOLUTE_IMPORT.sub(r"from . import \1", path.read_text())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=PACKAGE_DIR, help="directory to write (default: this package)"
    )
    args = parser.parse_args(argv)
    try:
        files = generated_files()
    except ImportError as exc:
        if not (exc.name or "").startswith("grpc_tools"):
            raise
        print(
            "fedpenalty.proto.generate: error: regenerating the gRPC code needs grpcio-tools, "
            "part of the test extra: pip install -e '.[test]'",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.out / name).write_text(text)
        print(args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
