#!/bin/sh
# OBJCACHE for Verilator builds: verilated.mk runs "$(OBJCACHE) $(CXX) ..." for every
# compile. A compile of one of Verilator's own run-time sources (verilated.cpp,
# verilated_vpi.cpp, ...: the same object in every model built with the same flags) is kept
# in $MRC_OBJCACHE_DIR, keyed by the whole command line, the compiler's version and the
# source's size and time stamp, and copied from there the next time; every other compile
# runs as it is. Set by sim/tb/runner.py and sim/tb/verilated.py (docs/testing.md).
case "$*" in
    *" -c -o "*/verilator/include/*.cpp) ;;
    *) exec "$@" ;;
esac
[ -n "$MRC_OBJCACHE_DIR" ] || exec "$@"

object= previous=
for arg in "$@"; do
    [ "$previous" = "-o" ] && object=$arg
    previous=$arg
done
source=$arg
depends=${object%.o}.d
key=$({ printf '%s\n' "$@"; "$1" --version; ls -l --time-style=+%s "$source"; } \
      | sha256sum | cut -c1-32)
entry=$MRC_OBJCACHE_DIR/$key

if [ -f "$entry/$object" ] && [ -f "$entry/$depends" ]; then
    cp "$entry/$object" "$object" && cp "$entry/$depends" "$depends" && exit 0
fi
"$@" || exit $?
mkdir -p "$MRC_OBJCACHE_DIR" || exit 0
staging=$(mktemp -d "$MRC_OBJCACHE_DIR/.new.XXXXXX") || exit 0
# A rename is atomic: two builds that compiled the same object at once both succeed, and
# one of their copies is kept.
if cp "$object" "$depends" "$staging/" && mv -T "$staging" "$entry" 2>/dev/null; then
    exit 0
fi
rm -rf "$staging"
exit 0
