// Command caddy is a Caddy binary with the standard modules plus Sluice,
// so `go run ./cmd/caddy run --config Caddyfile.example` works without xcaddy.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/sluice-router/sluice"
)

func main() {
	caddycmd.Main()
}
