# Sourced by the device scripts (scripts/device-check.sh, scripts/device-n4.sh): a lent machine is bare and
# offline, so the wheels its image lacks travel in .whl (pyzmq, cryptography, cffi, pycparser for its
# Python) and iproute2 (ip, tc) in .ipr (Debian packages) when it has none; both are git-ignored and carried
# by the run (carry: [".whl", ".ipr"]). Sets PYTHONPATH and PATH for what follows.
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
if ! command -v tc >/dev/null 2>&1 && [ -d .ipr ]; then
  mkdir -p /tmp/ipr && for f in .ipr/*.deb; do dpkg -x "$f" /tmp/ipr; done
  for b in ip tc; do
    real=$(ls /tmp/ipr/{bin,sbin,usr/bin,usr/sbin}/$b 2>/dev/null | head -1)
    printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/ipr/lib/x86_64-linux-gnu:/tmp/ipr/usr/lib/x86_64-linux-gnu exec %s "$@"\n' "$real" \
      > /tmp/ipr/$b.sh && mv /tmp/ipr/$b.sh /tmp/ipr/wrap-$b
    chmod +x /tmp/ipr/wrap-$b
  done
  mkdir -p /tmp/iprbin && mv /tmp/ipr/wrap-ip /tmp/iprbin/ip && mv /tmp/ipr/wrap-tc /tmp/iprbin/tc
  export PATH="/tmp/iprbin:$PATH"
fi
