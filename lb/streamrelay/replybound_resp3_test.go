package streamrelay

import (
	"context"
	"crypto/tls"
	"maps"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redistest"
)

// dialledClient is a client of tg dialled as the relay dials
// (dialBounded), its reads split a byte at a time when oneByte.
func dialledClient(t *testing.T, tg redistest.Target, limit int64, oneByte bool) rueidis.Client {
	t.Helper()
	opt, err := tg.Conn.WithDefaults().ClientOption(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	dial := dialBounded(limit)
	opt.DialCtxFn = func(ctx context.Context, addr string, d *net.Dialer, tc *tls.Config) (net.Conn, error) {
		c, err := dial(ctx, addr, d, tc)
		if err == nil && oneByte {
			bc := c.(*boundedConn)
			bc.Conn = oneByteConn{bc.Conn}
		}
		return c, err
	}
	cl, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// Replies of the RESP3 types Redis sends (maps, sets, doubles, booleans,
// big numbers, verbatim strings, nulls, errors, pushes, nested arrays)
// come through a client dialled with dialBounded exactly as through a
// plain one.
func TestBoundedConnRESP3LikeAPlainClient(t *testing.T) {
	tg := redistest.Targets(t)[0]
	ctx := context.Background()
	plain := redistest.Client(t, tg.Conn)
	key := uniqueKey(t)
	t.Cleanup(func() {
		for _, s := range []string{"", ":h", ":s", ":z"} {
			plain.Do(context.Background(), plain.B().Del().Key(key+s).Build())
		}
	})
	must := func(r rueidis.RedisResult) {
		t.Helper()
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
	for _, fv := range [][2]string{{"a", ""}, {"crlf", "x\r\n*2\r\n$-1\r\n"}, {"big", strings.Repeat("b", 3000)}} {
		must(plain.Do(ctx, plain.B().Xadd().Key(key).Id("*").FieldValue().FieldValue(fv[0], fv[1]).FieldValue("n", "1").Build()))
	}
	must(plain.Do(ctx, plain.B().Hset().Key(key+":h").FieldValue().FieldValue("f", "v").FieldValue("e", "").FieldValue("g", "\r\n").Build()))
	must(plain.Do(ctx, plain.B().Sadd().Key(key+":s").Member("m", "n", "").Build()))
	must(plain.Do(ctx, plain.B().Zadd().Key(key+":z").ScoreMember().ScoreMember(1.5, "m").ScoreMember(-2e10, "n").ScoreMember(0.1, "o").Build()))

	type check struct {
		name string
		cmd  func(c rueidis.Client) rueidis.Completed
		want string // in the reply's rendering: its type
	}
	lua := func(script string) func(c rueidis.Client) rueidis.Completed {
		return func(c rueidis.Client) rueidis.Completed {
			return c.B().Eval().Script("redis.setresp(3); " + script).Numkeys(1).Key(key).Build()
		}
	}
	checks := []check{
		{"PING", func(c rueidis.Client) rueidis.Completed { return c.B().Ping().Build() }, `"simple string"`},
		{"XRANGE", func(c rueidis.Client) rueidis.Completed { return c.B().Xrange().Key(key).Start("-").End("+").Build() }, `"array"`},
		{"XINFO STREAM FULL", func(c rueidis.Client) rueidis.Completed { return c.B().XinfoStream().Key(key).Full().Build() }, `"map"`},
		{"HGETALL", func(c rueidis.Client) rueidis.Completed { return c.B().Hgetall().Key(key + ":h").Build() }, `"map"`},
		{"SMEMBERS", func(c rueidis.Client) rueidis.Completed { return c.B().Smembers().Key(key + ":s").Build() }, `"set"`},
		{"ZSCORE", func(c rueidis.Client) rueidis.Completed { return c.B().Zscore().Key(key + ":z").Member("n").Build() }, `"float64"`},
		{"ZRANGE WITHSCORES", func(c rueidis.Client) rueidis.Completed {
			return c.B().Zrange().Key(key + ":z").Min("0").Max("-1").Withscores().Build()
		}, `"float64"`},
		{"GET of none", func(c rueidis.Client) rueidis.Completed { return c.B().Get().Key(key + ":none").Build() }, `"null"`},
		{"MGET", func(c rueidis.Client) rueidis.Completed { return c.B().Mget().Key(key+":none", key+":none2").Build() }, `"null"`},
		{"INCR of a stream", func(c rueidis.Client) rueidis.Completed { return c.B().Incr().Key(key).Build() }, `"simple error"`},
		{"OBJECT ENCODING", func(c rueidis.Client) rueidis.Completed { return c.B().ObjectEncoding().Key(key + ":h").Build() }, `"blob string"`},
		{"CONFIG GET", func(c rueidis.Client) rueidis.Completed { return c.B().ConfigGet().Parameter("maxmemory*").Build() }, `"map"`},
		{"COMMAND DOCS", func(c rueidis.Client) rueidis.Completed { return c.B().CommandDocs().CommandName("xread").Build() }, `"map"`},
		{"Lua double", lua(`return {double=3.25}`), `"float64"`},
		{"Lua booleans", lua(`return {true, false}`), `"boolean"`},
		{"Lua big number", lua(`return {big_number='123456789012345678901234567890'}`), `"big number"`},
		{"Lua verbatim", lua(`return {verbatim_string={format='txt', string='a\r\nb'}}`), `"verbatim string"`},
		{"Lua map and set", lua(`return {map={a={set={x=true, y=true}}, b={map={}}}}`), `"set"`},
		{"Lua nested", lua(`return {1, {2, {3, {4, {5, {}}}}}, redis.call('HGETALL', KEYS[1]..':h')}`), `"map"`},
		{"Lua error", lua(`return redis.error_reply('ERR of a script')`), `"simple error"`},
	}
	for _, oneByte := range []bool{false, true} {
		name := map[bool]string{false: "dialBounded", true: "dialBounded,1-byte-reads"}[oneByte]
		t.Run(name, func(t *testing.T) {
			bounded := dialledClient(t, tg, 1<<20, oneByte)
			for _, c := range checks {
				want, werr := plain.Do(ctx, c.cmd(plain)).ToMessage()
				got, gerr := bounded.Do(ctx, c.cmd(bounded)).ToMessage()
				if asCut(gerr) != nil || got.String() != want.String() || errString(gerr) != errString(werr) {
					t.Errorf("%s: %s, %v; a plain client had %s, %v", c.name, got.String(), gerr, want.String(), werr)
				}
				if !strings.Contains(got.String(), `"Type":`+c.want) {
					t.Errorf("%s: %s, want a %s in it", c.name, got.String(), c.want)
				}
			}

			// HELLO 3 and CLIENT INFO differ by connection: the same but for
			// the connection's id, and a verbatim string.
			hello := func(c rueidis.Client) map[string]string {
				m, err := c.Do(ctx, c.B().Hello().Protover(3).Build()).AsMap()
				if err != nil {
					t.Fatalf("HELLO 3: %v", err)
				}
				out := map[string]string{}
				for k, v := range m {
					if k != "id" {
						out[k] = v.String()
					}
				}
				return out
			}
			if got, want := hello(bounded), hello(plain); len(got) < 5 || !maps.Equal(got, want) {
				t.Errorf("HELLO 3: %v; a plain client had %v", got, want)
			}
			info, err := bounded.Do(ctx, bounded.B().ClientInfo().Build()).ToMessage()
			if s, _ := info.ToString(); err != nil || !strings.Contains(info.String(), `"verbatim string"`) || !strings.HasPrefix(s, "txt:id=") {
				t.Errorf("CLIENT INFO: %s, %v", info.String(), err)
			}

			// A push: a message on a channel the client subscribes.
			channel := key + ":" + name
			got := make(chan string, 1)
			subCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				done <- bounded.Receive(subCtx, bounded.B().Subscribe().Channel(channel).Build(), func(m rueidis.PubSubMessage) {
					select {
					case got <- m.Message:
					default:
					}
				})
			}()
			waitFor(t, "a subscriber", func() bool {
				n, err := plain.Do(ctx, plain.B().Publish().Channel(channel).Message("hi\r\n>3\r\n").Build()).AsInt64()
				return err == nil && n > 0
			}, func() string { return "" })
			if m := <-got; m != "hi\r\n>3\r\n" {
				t.Errorf("the message came as %q", m)
			}
			cancel()
			<-done
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
