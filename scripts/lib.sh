# Shell functions the scripts share (sourced, not run).

# The cache directory, chosen as quarry chooses it (config/paths.cc).
cache_dir() {
  if [[ -n ${QUARRY_CACHE_DIR:-} ]]; then
    echo "$QUARRY_CACHE_DIR"
  elif [[ $(id -u) -eq 0 ]]; then
    echo /var/cache/quarry
  else
    echo "${XDG_CACHE_HOME:-$HOME/.cache}/quarry"
  fi
}

# venv_path NAME REQUIREMENTS: where scripts/setup keeps the virtual environment of those pinned
# requirements: <cache>/NAME-<first 16 hex digits of their SHA-256>.
venv_path() {
  local hash
  hash=$(sha256sum "$2" | cut -c1-16)
  echo "$(cache_dir)/$1-$hash"
}
