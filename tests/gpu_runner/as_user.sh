#!/bin/sh
# Run a command as an ordinary user (nobody, or $KF_TEST_USER), in a private mount namespace in
# which root's home shows only the interpreter (a pyenv under /root is not readable by others).
# Usage (as root): sh as_user.sh PROGRAM ARGS...   Environment: KF_TEST_HOME (the user's HOME).
set -e
user="${KF_TEST_USER:-nobody}"
home="${KF_TEST_HOME:-/tmp}"
exec unshare -m sh -c '
  set -e
  mount --make-rprivate /
  if [ -d /root/.pyenv ]; then
    shadow=$(mktemp -d); chmod 755 "$shadow"; mkdir "$shadow/.pyenv"
    mount --bind /root/.pyenv "$shadow/.pyenv"
    mount --rbind "$shadow" /root
  fi
  u="$1"; h="$2"; shift 2
  exec setpriv --reuid "$u" --regid "$(id -g "$u")" --clear-groups --reset-env env HOME="$h" PATH="$PATH" PYTHONPATH="$PYTHONPATH" "$@"
' sh "$user" "$home" "$@"
