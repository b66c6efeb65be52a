"""src/hash.h's Mix64 (splitmix64's finalizer) on Python ints, for tests that
compute hashes, index home slots or file checksums by hand."""

M64 = (1 << 64) - 1


def mix64(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)
