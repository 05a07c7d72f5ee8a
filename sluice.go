// Package sluice is the root package of the Sluice Caddy plugin. It holds no
// code of its own: it exists so that the module path can be imported.
//
// xcaddy builds a custom Caddy by generating a main package that blank-imports
// each plugin's module path (`xcaddy build --with github.com/sluice-router/sluice`
// imports exactly "github.com/sluice-router/sluice"). Caddy modules register
// themselves in init functions, so only packages that end up in the import
// graph are registered. The blank import below pulls the caddymodule package,
// and with it every Sluice Caddy module, into any binary that imports the
// module path, so `caddy list-modules` shows them.
package sluice

import (
	_ "github.com/sluice-router/sluice/caddymodule"
	"github.com/sluice-router/sluice/internal/version"
)

// Version is Sluice's release version (semantic versioning, no "v"), as the
// health endpoints report it. It is written once, in internal/version.
// `caddy list-modules --versions` shows the Go module version the binary
// was built with instead (see build/README.md).
const Version = version.Version
