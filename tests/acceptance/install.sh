#!/usr/bin/env bash
# `meson install` puts the libraries, the header and shmverbs.pc in place, and a
# program built with `pkg-config --cflags --libs shmverbs` runs against our
# drop-in libibverbs, not Debian's.
#   install.sh BUILD_DIR
set -euo pipefail
build=$1
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

meson install -C "$build" --no-rebuild --destdir "$stage" >/dev/null

pc=$(find "$stage" -name shmverbs.pc | head -n1)
[ -n "$pc" ] || { echo "FAIL: shmverbs.pc not installed"; exit 1; }
prefix=$(pkg-config --variable=prefix "$pc")
export PKG_CONFIG_PATH=$(dirname "$pc")
pcflags=(--define-variable=prefix="$stage$prefix")

dropin=$(pkg-config "${pcflags[@]}" --variable=dropindir shmverbs)
for f in libibverbs.so.1 libibverbs.so libmlx5.so.1 libefa.so.1; do
	[ -e "$dropin/$f" ] || { echo "FAIL: $dropin/$f not installed"; exit 1; }
done
preload=$(pkg-config "${pcflags[@]}" --variable=preload shmverbs)
[ -e "$preload" ] || { echo "FAIL: $preload not installed"; exit 1; }
daemon="$stage$prefix/bin/shmverbsd"
[ -x "$daemon" ] || { echo "FAIL: $daemon not installed"; exit 1; }
header=$(pkg-config "${pcflags[@]}" --variable=includedir shmverbs)/shmverbs/shmverbs.h
[ -f "$header" ] || { echo "FAIL: $header not installed"; exit 1; }

cat > "$stage/prog.c" <<'C'
#include <shmverbs/shmverbs.h>
#include <stdio.h>

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		return 1;
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		return 2;
	printf("%s %s emulated=%d\n", shmverbs_version(), ibv_get_device_name(list[0]),
	       shmverbs_is_emulated(ctx));
	int emulated = shmverbs_is_emulated(ctx);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return emulated ? 0 : 3;
}
C
# shellcheck disable=SC2046
cc -o "$stage/prog" "$stage/prog.c" $(pkg-config "${pcflags[@]}" --cflags --libs shmverbs)
# In a sanitizer build the runtime our library needs must come first, as the
# program itself is not instrumented.
runtimes=$(ldd "$dropin/libibverbs.so.1" | awk '$1 ~ /^lib(a|t|ub)san\.so/ {print $3}' | paste -sd:)
out=$(env -u LD_LIBRARY_PATH LD_PRELOAD="$runtimes" ASAN_OPTIONS=detect_leaks=0 "$stage/prog")
echo "$out"
case "$out" in
*"shm0 emulated=1"*) ;;
*) echo "FAIL: unexpected output"; exit 1 ;;
esac
loaded=$(env -u LD_LIBRARY_PATH ldd "$stage/prog" | awk '/libibverbs.so.1/ {print $3}')
case "$loaded" in
"$dropin"/*) echo "PASS: linked against $loaded" ;;
*) echo "FAIL: program loads $loaded instead of the drop-in"; exit 1 ;;
esac
