// Package version holds Sluice's release version, the one place it is
// written. The root package re-exports it as sluice.Version; the health
// answers (GET /_custom_router/health, admin GET /sluice/health) report it.
//
// `caddy list-modules --versions` does not read it: Caddy takes a module's
// version from the Go build information of the binary (the version of the
// github.com/sluice-router/sluice module the build required, e.g. v0.9.0
// for `xcaddy build --with github.com/sluice-router/sluice@v0.9.0`, or
// "(devel)" / a pseudo-version for a local checkout). Tag releases
// v<Version> so both agree.
package version

// Version is Sluice's release version (semantic versioning, no "v").
const Version = "0.9.0"
