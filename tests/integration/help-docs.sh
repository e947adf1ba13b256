#!/bin/bash
# Each command's --help and its reference in docs/ name the same options.
#
# For every command, the reference docs/CMD.md has a section "## Options"
# (up to the next "## " heading) whose tables list one option, or a few
# spellings of one, per row, in the first column. Both ways are checked:
# - every option --help mentions (--foo; for sparse_dd, xapi's -foo too)
#   appears in that section;
# - every option in the first column of its tables appears in --help.
# Short options (-C) are checked the same way where --help lists them as
# "-C, --connections".
. "$(dirname "$0")/lib.sh"
tmpdir_make

DOCS=$REPO_DIR/docs
problems=0

# problem TEXT: records one disagreement (all are listed before failing).
problem () {
    note "$*"
    problems=$((problems + 1))
}

# options_section FILE: the lines of FILE's "## Options" section.
options_section () {
    awk '/^## / { inside = ($0 ~ /^## Options[[:space:]]*$/); next }
         inside' "$1"
}

# first_cells: the first cell of each table row on stdin, but the
# header's separator row.
first_cells () {
    awk -F'|' '/^\|/ && $2 !~ /^[-: ]+$/ { print $2 }'
}

# long_opts: the --foo options named in the text on stdin, one a line.
long_opts () {
    grep -oE -- '--[a-z][a-z0-9-]*' | sort -u
}

# short_opts: the -X options listed in the text on stdin as "-X, --foo".
short_opts () {
    grep -oE -- '(^|[[:space:]`])-[A-Za-z],' | grep -oE -- '-[A-Za-z]' |
        sort -u
}

# xapi_opts: sparse_dd's one-dash options (-src, -dest-proto) named in
# the text on stdin; a --foo is not one of them.
xapi_opts () {
    grep -oE -- '(^|[^-[:alnum:]])-[a-z][a-z0-9-]+' |
        grep -oE -- '-[a-z][a-z0-9-]+$' | sort -u
}

# has_opt OPT FILE: FILE names OPT as a whole word (--no-flush does not
# name --flush, nor -dest-proto -dest).
has_opt () {
    grep -qE -- "(^|[^-[:alnum:]])$1([^-[:alnum:]]|\$)" "$2"
}

for cmd in serve copy info sum sparse_dd; do
    doc=$DOCS/$cmd.md
    [ -f "$doc" ] || { problem "$cmd: no reference docs/$cmd.md"; continue; }
    "$NBDFLOW" "$cmd" --help >"$TMP/help" 2>&1 ||
        fail "nbdflow $cmd --help failed: $(cat "$TMP/help")"
    options_section "$doc" >"$TMP/section"
    [ -s "$TMP/section" ] ||
        { problem "$cmd: docs/$cmd.md has no '## Options' section"; continue; }
    first_cells <"$TMP/section" >"$TMP/cells"
    [ -s "$TMP/cells" ] ||
        { problem "$cmd: docs/$cmd.md lists no options in a table"; continue; }

    if [ "$cmd" = sparse_dd ]; then
        { long_opts <"$TMP/help"; xapi_opts <"$TMP/help"; } >"$TMP/in-help"
        { long_opts <"$TMP/cells"; xapi_opts <"$TMP/cells"; } >"$TMP/in-doc"
    else
        { long_opts <"$TMP/help"; short_opts <"$TMP/help"; } >"$TMP/in-help"
        { long_opts <"$TMP/cells"
          grep -oE -- '`-[A-Za-z]([ `,]|$)' "$TMP/cells" |
              grep -oE -- '-[A-Za-z]' | sort -u
        } >"$TMP/in-doc"
    fi
    n_help=$(wc -l <"$TMP/in-help")
    n_doc=$(wc -l <"$TMP/in-doc")
    [ "$n_help" -gt 0 ] || problem "$cmd: --help names no options"

    while read -r opt; do
        has_opt "$opt" "$TMP/section" ||
            problem "$cmd: '$opt' is in --help but not in docs/$cmd.md's Options"
    done <"$TMP/in-help"
    while read -r opt; do
        has_opt "$opt" "$TMP/help" ||
            problem "$cmd: docs/$cmd.md's Options table lists '$opt', --help does not"
    done <"$TMP/in-doc"
    note "$cmd: $n_help options in --help, $n_doc in the reference's tables"
done

[ "$problems" = 0 ] ||
    fail "$problems disagreements between --help and docs/ (listed above)"
echo "every command's --help and reference name the same options"
