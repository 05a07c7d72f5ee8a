package caddymodule

import (
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluice-router/sluice/lb/redisconn"
)

// redisConnection is how a module reaches Redis: the same options, names
// and defaults wherever Sluice shares state through Redis.
//
//	redis        <host:port>...   # default 127.0.0.1:6379; one node of a cluster is enough
//	username     <user>
//	password     <password>       # {env.REDIS_PASSWORD} works
//	db           <n>
//	tls          on|off
//	ca_file      <path>
//	dial_timeout <duration>
//	read_timeout <duration>
//	key_prefix   <prefix>
type redisConnection struct {
	// Redis address(es), host:port (default 127.0.0.1:6379).
	Redis    []string `json:"redis,omitempty"`
	Username string   `json:"username,omitempty"`
	Password string   `json:"password,omitempty"`
	DB       int      `json:"db,omitempty" sluice:"min=0"`
	TLS      bool     `json:"tls,omitempty"`
	CAFile   string   `json:"ca_file,omitempty"`
	// Timeouts of one Redis call (defaults 1s dial, 250ms read).
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`
	ReadTimeout caddy.Duration `json:"read_timeout,omitempty"`
	// KeyPrefix separates deployments sharing one Redis.
	KeyPrefix string `json:"key_prefix,omitempty"`
}

// conn is the connection config, placeholders in the password replaced.
func (c redisConnection) conn() redisconn.Config {
	addrs := c.Redis
	if len(addrs) == 0 {
		addrs = []string{"127.0.0.1:6379"}
	}
	return redisconn.Config{
		Addrs: addrs, Username: c.Username, Password: caddy.NewReplacer().ReplaceKnown(c.Password, ""), DB: c.DB,
		TLS: c.TLS, CAFile: c.CAFile, DialTimeout: time.Duration(c.DialTimeout), ReadTimeout: time.Duration(c.ReadTimeout),
		KeyPrefix: c.KeyPrefix,
	}
}
