#!/bin/sh
# Run a command as an ordinary user (nobody, or $KF_TEST_USER), in a private mount namespace in
# which root's home shows only what the command needs (an interpreter or checkout under /root is
# not readable by others): the folders in $KF_TEST_EXPOSE (colon-separated; default /root/.pyenv).
# Usage (as root): sh as_user.sh PROGRAM ARGS...   Environment: KF_TEST_HOME (the user's HOME).
set -e
user="${KF_TEST_USER:-nobody}"
home="${KF_TEST_HOME:-/tmp}"
expose="${KF_TEST_EXPOSE:-/root/.pyenv}"
exec unshare -m sh -c '
  set -e
  mount --make-rprivate /
  shadow=$(mktemp -d); chmod 755 "$shadow"
  IFS=:
  for path in $3; do
    case "$path" in /root/*) ;; *) continue ;; esac
    [ -e "$path" ] || continue
    mkdir -p "$shadow/${path#/root/}"
    mount --bind "$path" "$shadow/${path#/root/}"
  done
  unset IFS
  mount --rbind "$shadow" /root
  u="$1"; h="$2"; shift 3
  exec setpriv --reuid "$u" --regid "$(id -g "$u")" --clear-groups --reset-env \
    env HOME="$h" PATH="$PATH" PYTHONPATH="$PYTHONPATH" "$@"
' sh "$user" "$home" "$expose" "$@"
