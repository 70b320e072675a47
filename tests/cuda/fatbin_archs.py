#!/usr/bin/env python3
"""tests/cuda/fatbin_archs.py: check that the CUDA plugin's fatbin holds SASS for every configured architecture and PTX for the last."""
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "PTX", 2: "ELF"}


def entries(data):
    """(kind, sm) of every entry of a fatbin, as cuobjdump --list-elf/--list-ptx would show them."""
    magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, 0)
    if magic != FATBIN_MAGIC:
        raise ValueError(f"not a fatbin: magic {magic:#x}, expected {FATBIN_MAGIC:#x}")
    offset, end = header_size, header_size + fat_size
    while offset < end:
        kind, _entry_version, entry_header, padded = struct.unpack_from("<HHIQ", data, offset)
        sm = struct.unpack_from("<I", data, offset + 28)[0]
        yield KINDS.get(kind, str(kind)), sm
        offset += entry_header + padded


def main() -> int:
    path, archs = sys.argv[1], [int(a) for a in sys.argv[2].split(",")]
    with open(path, "rb") as f:
        found = list(entries(f.read()))
    for kind, sm in found:
        print(f"{kind} sm_{sm}")
    missing = [f"sm_{a} SASS" for a in archs if ("ELF", a) not in found]
    if ("PTX", archs[-1]) not in found:
        missing.append(f"compute_{archs[-1]} PTX")
    if missing:
        print("missing from the fatbin: " + ", ".join(missing))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
