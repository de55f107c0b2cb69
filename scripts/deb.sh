#!/usr/bin/env bash
# Builds agui-serve's Debian package from a binary already built, with dpkg-deb: the
# binary in /usr/bin, the unit (deploy/debian/agui-serve.service), the configuration
# /etc/agui-serve/config.toml as a conffile, the maintainer scripts of deploy/debian, the
# licenses, changelog and docs. Prints the package's path.
# Usage: scripts/deb.sh [BINARY [VERSION]]
#   BINARY  default target/release/agui-serve (built when missing)
#   VERSION default Cargo.toml's
# DEB_COMPRESSION=none|gzip|xz (default xz; the tests use gzip, fast on a debug binary).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/release/agui-serve}"
if [ ! -x "$bin" ]; then
  (cd "$root" && cargo build --release --locked --bin agui-serve)
fi
field() { sed -n "s/^$1 = \"\\(.*\\)\"/\\1/p" "$root/Cargo.toml" | head -n1; }
version="${2:-$(field version)}"
arch="$(dpkg --print-architecture)"
out="$root/target/debian"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
pkg="$stage/agui-serve"

install -D -m 0755 "$bin" "$pkg/usr/bin/agui-serve"
install -D -m 0644 "$root/deploy/debian/agui-serve.service" "$pkg/lib/systemd/system/agui-serve.service"
install -D -m 0644 "$root/deploy/debian/config.toml" "$pkg/etc/agui-serve/config.toml"
doc="$pkg/usr/share/doc/agui-serve"
install -d "$doc"
install -m 0644 "$root/README.md" "$root/CHANGELOG.md" "$root/LICENSE-MIT" "$root/LICENSE-APACHE" "$doc/"
install -m 0644 "$root"/docs/*.md "$doc/"
cat >"$doc/copyright" <<TEXT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: agui-serve

Files: *
Copyright: The agui-serve authors
License: MIT or Apache-2.0
 The texts are LICENSE-MIT and LICENSE-APACHE in this directory.
TEXT

install -d "$pkg/DEBIAN"
install -m 0755 "$root/deploy/debian/postinst" "$root/deploy/debian/prerm" "$root/deploy/debian/postrm" "$pkg/DEBIAN/"
echo /etc/agui-serve/config.toml >"$pkg/DEBIAN/conffiles"
size="$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)"
# The shared libraries the binary needs, with their versions (dpkg-shlibdeps reads a
# source package's control file: a minimal one in the staging folder).
depends="libc6, libgcc-s1"
if command -v dpkg-shlibdeps >/dev/null; then
  mkdir -p "$stage/debian"
  printf 'Source: agui-serve\n\nPackage: agui-serve\nArchitecture: any\n' >"$stage/debian/control"
  found="$(cd "$stage" && dpkg-shlibdeps -O -e"$pkg/usr/bin/agui-serve" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')"
  [ -n "$found" ] && depends="$found"
fi
cat >"$pkg/DEBIAN/control" <<TEXT
Package: agui-serve
Version: $version
Architecture: $arch
Maintainer: The agui-serve authors <agui-serve@localhost>
Installed-Size: $size
Depends: $depends, passwd, init-system-helpers
Recommends: bubblewrap, nodejs, npm
Section: net
Priority: optional
Homepage: https://docs.ag-ui.com
Description: $(field description)
 agui-serve puts agent runtimes (Claude Code, Codex, Gemini CLI, any Agent Client
 Protocol agent) behind the AG-UI protocol, so a React app (CopilotKit or any AG-UI
 client) can drive them, each thread in a confined workspace of its own. It serves a
 built-in demo agent from the start.
TEXT

mkdir -p "$out"
deb="$out/agui-serve_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"${DEB_COMPRESSION:-xz}" --build "$pkg" "$deb" >/dev/null
echo "$deb"
