#!/usr/bin/env bash
# format_check.sh [SOURCE_DIR] — fails if any C file of the repository differs from what
# clang-format makes of it with the checked-in .clang-format.
#
# The files are every *.c and *.h that git tracks or would track (untracked but not ignored),
# so a new file is checked before its first commit. Prints the files that differ and how to
# fix them (`make format`, or clang-format -i FILE). Needs git and clang-format (the style was
# written for clang-format 14: apt-get install clang-format).
set -euo pipefail

src=${1:-"$(dirname "$0")/.."}
cd "$src"

if ! command -v clang-format >/dev/null 2>&1; then
    echo "format check: FAIL: clang-format is not installed (apt-get install clang-format)" >&2
    exit 1
fi
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    echo "format check: FAIL: $(pwd) is not a git work tree, so the file list is unknown" >&2
    exit 1
fi

version=$(clang-format --version)
case "$version" in
*"version 14."*) ;;
*) echo "format check: note: the style was set with clang-format 14; this is: $version" ;;
esac

files=()
while IFS= read -r -d '' f; do
    # A tracked file deleted in the work tree is still listed by git ls-files -c.
    [ -f "$f" ] && files+=("$f")
done < <(git ls-files -z -co --exclude-standard -- '*.c' '*.h' | sort -zu)

if [ ${#files[@]} -eq 0 ]; then
    echo "format check: FAIL: no *.c or *.h files found in $(pwd)" >&2
    exit 1
fi

bad=()
for f in "${files[@]}"; do
    if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
        bad+=("$f")
    fi
done

if [ ${#bad[@]} -ne 0 ]; then
    echo "format check: FAIL: ${#bad[@]} of ${#files[@]} files differ from .clang-format:" >&2
    printf '    %s\n' "${bad[@]}" >&2
    echo "fix with: clang-format -i <file>  (or make format)" >&2
    exit 1
fi
echo "format check: ok (${#files[@]} files)"
