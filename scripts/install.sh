#!/usr/bin/env bash
# Install fluxkv as a service: the binary, the systemd units and the example configs.
# Run by `make install` (which builds bin/fluxkv first). Environment:
#   PREFIX   install prefix of the binary (default /usr/local): $PREFIX/bin/fluxkv
#   DESTDIR  staging root for packaging (default empty: the live system)
#   BIN      the binary to install (default bin/fluxkv)
# Units go to $DESTDIR/lib/systemd/system, configs to $DESTDIR/etc/fluxkv; an existing
# config is never overwritten. Run as root without DESTDIR, it also creates the
# fluxkv system user and group and reloads systemd.
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
BIN=${BIN:-bin/fluxkv}
UNITDIR=/lib/systemd/system
CONFDIR=/etc/fluxkv
SERVICE_USER=fluxkv

[ -x "$BIN" ] || { echo "install: $BIN is missing or not executable (run make build)" >&2; exit 1; }
live=false
if [ -z "$DESTDIR" ] && [ "$(id -u)" -eq 0 ]; then
  live=true
fi

if $live; then
  getent group "$SERVICE_USER" >/dev/null || groupadd --system "$SERVICE_USER"
  if ! getent passwd "$SERVICE_USER" >/dev/null; then
    nologin=$(command -v nologin || echo /usr/sbin/nologin)
    useradd --system --gid "$SERVICE_USER" --no-create-home --home-dir /var/lib/fluxkv \
      --shell "$nologin" --comment "fluxkv cache" "$SERVICE_USER"
  fi
fi

install -D -m 0755 "$BIN" "$DESTDIR$PREFIX/bin/fluxkv"
echo "installed $DESTDIR$PREFIX/bin/fluxkv"

install -d -m 0755 "$DESTDIR$UNITDIR"
for role in master owner; do
  unit="fluxkv-$role.service"
  # The units name /usr/local/bin/fluxkv; point them at $PREFIX/bin.
  sed "s#/usr/local/bin/fluxkv#$PREFIX/bin/fluxkv#g" "scripts/$unit" >"$DESTDIR$UNITDIR/$unit.tmp"
  chmod 0644 "$DESTDIR$UNITDIR/$unit.tmp"
  mv -f "$DESTDIR$UNITDIR/$unit.tmp" "$DESTDIR$UNITDIR/$unit"
  echo "installed $DESTDIR$UNITDIR/$unit"
done

install -d -m 0755 "$DESTDIR$CONFDIR"
for cfg in master.yaml owner.yaml up.yaml; do
  dst="$DESTDIR$CONFDIR/$cfg"
  if [ -e "$dst" ]; then
    echo "kept existing $dst (the new example is scripts/examples/$cfg)"
    continue
  fi
  if $live; then
    # Readable by the service, not by everyone.
    install -m 0640 -g "$SERVICE_USER" "scripts/examples/$cfg" "$dst"
  else
    install -m 0644 "scripts/examples/$cfg" "$dst"
  fi
  echo "installed $dst"
done

# The cluster secret the units name (--cluster-secret-file): made here on a live
# install when absent, never staged into a package (each site needs its own).
SECRET=$CONFDIR/cluster.secret
if $live; then
  if [ -e "$SECRET" ]; then
    echo "kept existing $SECRET"
  else
    (umask 077; head -c 32 /dev/urandom | base64 >"$SECRET.tmp")
    chown "$SERVICE_USER:$SERVICE_USER" "$SECRET.tmp"
    chmod 0600 "$SECRET.tmp"
    mv -f "$SECRET.tmp" "$SECRET"
    echo "created $SECRET (0600, $SERVICE_USER): copy this same file to every node of the cluster"
  fi
else
  echo "not creating $SECRET under DESTDIR: on each cluster, make one and copy it to every node:"
  echo "  (umask 077; head -c 32 /dev/urandom | base64 >$SECRET); chown $SERVICE_USER:$SERVICE_USER $SECRET"
fi

# The master key pair the units name: master.key (--master-key-file, masters only)
# proves a master to owners; master.pub (--master-pubkey-file) is what owners accept.
# Made here like the secret, by the installed binary.
MKEY=$CONFDIR/master.key
MPUB=$CONFDIR/master.pub
if $live; then
  if [ -e "$MKEY" ] && [ -e "$MPUB" ]; then
    echo "kept existing $MKEY and $MPUB"
  else
    "$PREFIX/bin/fluxkv" gen-master-key --master-key-file "$MKEY" --master-pubkey-file "$MPUB"
    chown "$SERVICE_USER:$SERVICE_USER" "$MKEY" "$MPUB"
    echo "created $MKEY (0600, $SERVICE_USER) and $MPUB: copy master.key to the master node(s) only, master.pub to every owner"
  fi
else
  echo "not creating $MKEY under DESTDIR: on each cluster, make the pair on a master and copy master.pub to every owner:"
  echo "  fluxkv gen-master-key --master-key-file $MKEY --master-pubkey-file $MPUB; chown $SERVICE_USER:$SERVICE_USER $MKEY $MPUB"
fi

if $live && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi
cat <<MSG
next steps:
  edit $CONFDIR/owner.yaml (dram, master, large_file_paths/large_limit_size) and $CONFDIR/master.yaml
  copy $SECRET (one secret per cluster) to every node, mode 0600, owner $SERVICE_USER
  copy $MPUB to every owner node; keep $MKEY on the master node(s) only
  systemctl enable --now fluxkv-master   # on the control node
  systemctl enable --now fluxkv-owner    # on every node
  usermod -aG $SERVICE_USER USER         # users whose processes may attach to /run/fluxkv/fluxkv.sock
MSG
