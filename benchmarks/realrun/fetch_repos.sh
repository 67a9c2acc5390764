#!/usr/bin/env bash
# fetch_repos.sh REPOS_DIR [RECIPES.tsv]: put every repository that RECIPES.tsv names, at the commit it
# names, into REPOS_DIR/<owner>+<name>/ (a plain tree, no .git), the layout run-recipes expects.
#
# The list of repositories is the recipes file itself (columns repo and commit); this script only
# fetches. For each repository, the first source that has the commit is used:
#   1. a git directory under $MIRROR (default /work/.mirror): $MIRROR/<owner>+<name>/repo[/.git], as the
#      session tool `fetch github:<owner>/<name>` leaves it (a snapshot without its files of 4 MiB and
#      more: those are skipped and listed; none of them is read by a recipe);
#   2. otherwise `git clone https://github.com/<owner>/<name>` into $REPOS_DIR/.clones (needs network).
# A repository already present in REPOS_DIR is left alone (delete it to fetch it again).
set -u
[ "$#" -ge 1 ] || { echo "usage: $(basename "$0") REPOS_DIR [RECIPES.tsv]"; exit 2; }
out="$1"; recipes="${2:-$(dirname "$0")/recipes.tsv}"
MIRROR="${MIRROR:-/work/.mirror}"
mkdir -p "$out" || exit 1

extract() {  # extract GITDIR COMMIT DEST: COMMIT's tree into DEST, skipping blobs the snapshot lacks
  local g="$1" c="$2" dest="$3" line meta path mode type obj
  mkdir -p "$dest"
  git --git-dir="$g" ls-tree -r -z "$c" | while IFS= read -r -d '' line; do
    meta=${line%%$'\t'*}; path=${line#*$'\t'}
    read -r mode type obj <<< "$meta"
    [ "$type" = blob ] || continue
    mkdir -p "$dest/$(dirname "$path")"
    if git --git-dir="$g" cat-file -e "$obj" 2>/dev/null; then
      if [ "$mode" = 120000 ]; then ln -sf "$(git --git-dir="$g" cat-file blob "$obj")" "$dest/$path"
      else
        git --git-dir="$g" cat-file blob "$obj" > "$dest/$path"
        if [ "$mode" = 100755 ]; then chmod +x "$dest/$path"; fi
      fi
    else
      echo "  (absent from the snapshot, skipped: $path)"
    fi
  done
}

status=0
while IFS=$'\t' read -r name repo commit rest; do
  case "$name" in name|'#'*|'') continue;; esac
  dest="$out/${repo/\//+}"
  [ -d "$dest" ] && continue
  m="$MIRROR/${repo/\//+}/repo"; [ -d "$m/.git" ] && m="$m/.git"
  if git --git-dir="$m" cat-file -e "$commit^{commit}" 2>/dev/null; then
    echo "$repo@$commit (from $m)"
    extract "$m" "$commit" "$dest"
  else
    echo "$repo@$commit (git clone)"
    c="$out/.clones/${repo/\//+}"
    { [ -d "$c/.git" ] || git clone -q "https://github.com/$repo" "$c"; } &&
      git -C "$c" cat-file -e "$commit^{commit}" &&
      extract "$c/.git" "$commit" "$dest" || { echo "  cannot fetch $repo@$commit"; rm -rf "$dest"; status=1; }
  fi
done < "$recipes"
exit $status
