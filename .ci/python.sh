#!/usr/bin/env bash
# Print a runnable interpreter for NAME (python3, python3.10, /path/to/python, …), or nothing.
#   .ci/python.sh python3.10        # what the Makefile calls for PYTHON=python3.10
# Order: NAME itself when it runs (PATH, an absolute path); else a pyenv-installed version of it
# ($PYENV_ROOT/versions/X.Y.*/bin/pythonX.Y: pyenv's shims refuse versions that are installed but
# not selected, which is how this machine's 3.10/3.12/3.13 are). `.ci/run` installs a missing
# version with `pyenv install` when pyenv is there; otherwise install it from your distribution
# (deadsnakes on Ubuntu: apt install python3.10-venv) and pass its path as PYTHON.
set -uo pipefail
name=${1:?usage: python.sh NAME}
if "$name" -c 'import venv' >/dev/null 2>&1; then
  command -v "$name"
  exit 0
fi
version=${name##*python}
if [[ $version =~ ^3\.[0-9]+$ ]]; then
  root=${PYENV_ROOT:-$HOME/.pyenv}
  for candidate in $(ls -d "$root"/versions/"$version".* 2>/dev/null | sort -V -r); do
    if "$candidate/bin/python$version" -c 'import venv' >/dev/null 2>&1; then
      echo "$candidate/bin/python$version"
      exit 0
    fi
  done
fi
exit 0
