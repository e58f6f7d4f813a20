"""The tiny-model builder's output version, importable without torch (`opsctl lab up` checks its cache with it).

Bump when `ddtree.tiny.build` changes its output; cached builds with another version are rebuilt (the lab's and
the test fixtures')."""

BUILD_VERSION = 2
