package redisconn

import (
	"strings"

	"github.com/redis/rueidis"
)

// PermScript is a permission check run once when a config loads: prelude
// (Lua binding the scratch keys and channels from KEYS and ARGV) and steps
// (a Lua list of {command, args...}, in forms that leave nothing behind)
// run every command a user of Redis will need. A script stops at its first
// denied step and what it wrote is not rolled back, so each step runs
// under pcall and the first refusal comes back as NOPERM naming the
// command, then what, e.g. "on the pool's keys, which flow_control needs".
func PermScript(prelude, steps, what string) *rueidis.Lua {
	return rueidis.NewLuaScript(prelude + `
local steps = ` + steps + `
for _, step in ipairs(steps) do
  local r = redis.pcall(unpack(step))
  if type(r) == 'table' and r.err then
    return redis.error_reply('NOPERM this Redis user may not run ' .. step[1] ..
      ' ` + strings.ReplaceAll(what, `'`, `\'`) + ` (' .. r.err .. ')')
  end
end
return 1
`)
}
