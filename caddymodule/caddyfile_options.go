package caddymodule

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// Every Sluice directive and policy is parsed by parseBlock, and every
// plain option by setOption, so the Caddyfile and the JSON config are the
// same thing (an option's name is its JSON field name) and every error
// reads the same way: "<directive>: <option>: <problem>". Ranges are
// checked by the module's Validate, for JSON and Caddyfile alike.

// errUnknownOption is what an option setter returns for a name it does
// not know.
var errUnknownOption = errors.New("unknown option")

// parseBlock parses `<directive> [<pool>] { <option> <value>... }`. arg
// receives the optional argument (nil: the directive takes none); set is
// called for each option with its values (a setter for an option with a
// nested block reads it from d).
func parseBlock(d *caddyfile.Dispenser, directive string, arg *string, set func(opt string, vals []string) error) error {
	d.Next() // the directive or policy name
	if d.NextArg() {
		if arg == nil {
			return d.Errf("%s: takes no arguments, only a block; got %q", directive, d.Val())
		}
		*arg = d.Val()
		if d.NextArg() {
			return d.Errf("%s: takes at most one argument, the pool name; got extra %q", directive, d.Val())
		}
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		vals := d.RemainingArgs()
		if err := set(opt, vals); errors.Is(err, errUnknownOption) {
			return d.Errf("%s: unknown option %q", directive, opt)
		} else if err != nil {
			return d.Errf("%s: %s: %v", directive, opt, err)
		}
	}
	return nil
}

// setOption sets the field of the struct module points to whose JSON name
// is opt, from the option's values: strings as they are, numbers,
// durations (also plain seconds), on|off, and lists (values append).
// Maps and nested blocks are for the module's own parser.
//
// A field tagged sluice:"min=N" refuses a smaller value, and one tagged
// sluice:"positive" (a duration) a value <= 0: in JSON a zero means "the
// default", but a Caddyfile that writes 0 means 0.
func setOption(module any, opt string, vals []string) error {
	f, tag, ok := fieldByJSONName(reflect.ValueOf(module).Elem(), opt)
	if !ok {
		return errUnknownOption
	}
	if err := setValue(f, vals); err != nil {
		return err
	}
	switch {
	case tag == "positive" && f.Int() <= 0:
		return fmt.Errorf("must be positive, got %s", vals[0])
	case strings.HasPrefix(tag, "min="):
		min, _ := strconv.ParseFloat(strings.TrimPrefix(tag, "min="), 64)
		var v float64
		if f.CanFloat() {
			v = f.Float()
		} else {
			v = float64(f.Int())
		}
		if v < min {
			return fmt.Errorf("must be at least %g, got %s", min, vals[0])
		}
	}
	return nil
}

func setValue(f reflect.Value, vals []string) error {
	if f.Kind() == reflect.Slice && f.Type().Elem().Kind() == reflect.String {
		if len(vals) == 0 {
			return errors.New("needs at least one value")
		}
		f.Set(reflect.AppendSlice(f, reflect.ValueOf(vals)))
		return nil
	}
	if len(vals) != 1 {
		return fmt.Errorf("takes exactly one value, got %d", len(vals))
	}
	s := vals[0]
	switch {
	case f.Type() == reflect.TypeOf(caddy.Duration(0)):
		d, err := parseSecondsOrDuration(s)
		if err != nil {
			return err
		}
		f.SetInt(int64(d))
	case f.Kind() == reflect.String:
		f.SetString(s)
	case f.Kind() == reflect.Int, f.Kind() == reflect.Int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || f.OverflowInt(n) {
			return fmt.Errorf("%q is not an integer", s)
		}
		f.SetInt(n)
	case f.Kind() == reflect.Float64:
		x, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("%q is not a number", s)
		}
		f.SetFloat(x)
	case f.Kind() == reflect.Bool, f.Kind() == reflect.Pointer && f.Type().Elem().Kind() == reflect.Bool:
		on, err := parseOnOff(s)
		if err != nil {
			return err
		}
		if f.Kind() == reflect.Pointer {
			f.Set(reflect.ValueOf(&on))
		} else {
			f.SetBool(on)
		}
	default:
		return errUnknownOption
	}
	return nil
}

// fieldByJSONName finds the exported field tagged json:"name" (in
// embedded option groups too, as encoding/json does), and its sluice tag.
func fieldByJSONName(v reflect.Value, name string) (reflect.Value, string, bool) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		if sf.Anonymous && sf.Type.Kind() == reflect.Struct && sf.Tag.Get("json") == "" {
			if f, tag, ok := fieldByJSONName(v.Field(i), name); ok {
				return f, tag, true
			}
			continue
		}
		tag, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if tag == name && sf.IsExported() {
			return v.Field(i), sf.Tag.Get("sluice"), true
		}
	}
	return reflect.Value{}, "", false
}

func parseSecondsOrDuration(s string) (caddy.Duration, error) {
	s = strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		// Bound before converting: NaN or 1e300 would overflow int64.
		if math.IsNaN(f) || math.Abs(f) > 1e9 {
			return 0, fmt.Errorf("%q seconds is out of range", s)
		}
		return caddy.Duration(f * float64(time.Second)), nil
	}
	d, err := caddy.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration", s)
	}
	return caddy.Duration(d), nil
}

func parseOnOff(s string) (bool, error) {
	switch strings.ToLower(s) {
	case "on", "true", "yes":
		return true, nil
	case "off", "false", "no":
		return false, nil
	}
	return false, fmt.Errorf("want on or off, got %q", s)
}

// parseModule parses a module's whole block: hook (if any) takes the
// options that are not plain fields (handled true), setOption the rest.
//
// An option that holds one value may be given once: written twice (or,
// for the field the directive's argument sets, as the argument and as an
// option) the block would silently load with the last one. List and map
// options, and the options a hook adds entries with, stay repeatable.
func parseModule(d *caddyfile.Dispenser, directive string, arg *string, module any, hook func(opt string, vals []string) (bool, error)) error {
	given := map[string]bool{}
	return parseBlock(d, directive, arg, func(opt string, vals []string) error {
		if f, _, ok := fieldByJSONName(reflect.ValueOf(module).Elem(), opt); ok && f.Kind() != reflect.Slice && f.Kind() != reflect.Map {
			if arg != nil && *arg != "" && f.Kind() == reflect.String && f.Addr().Interface() == any(arg) {
				return fmt.Errorf("already given as the argument %q of the directive line", *arg)
			}
			if given[opt] {
				return errors.New("given more than once; keep one")
			}
			given[opt] = true
		}
		if hook != nil {
			if handled, err := hook(opt, vals); handled || err != nil {
				return err
			}
		}
		return setOption(module, opt, vals)
	})
}
