// Command chart-render renders a Helm chart's templates with Go's own text/template and
// the few Helm/sprig functions the neuron-dra-driver chart uses, so the chart can be
// checked on machines without a helm binary (tests/chart, hack/render-chart).
//
// It reads no YAML: the caller (hack/render-chart) merges values.yaml with the overrides,
// validates them against values.schema.json and passes the whole render context as JSON:
//
//	{"Values": {...}, "Release": {...}, "Chart": {...}, "Capabilities": {...}}
//
// Usage: chart-render -chart DIR -context FILE [-notes] [-strict]
//
// Output: every rendered templates/*.yaml (files starting with "_" only define named
// templates) as one multi-document YAML stream, each document headed by a "# Source:"
// comment as `helm template` prints it; with -notes, the rendered NOTES.txt instead.
// Template errors (including `fail`) are printed the way Helm prints them, exit status 1.
//
// Fidelity notes (what Helm does that we copy, because a chart that only works here would
// be worthless):
//   - values are decoded from JSON into map[string]any with float64 numbers, exactly as
//     Helm holds them, so a comparison that needs `int` here needs it under Helm too;
//   - templates run with missingkey=zero and "<no value>" is removed from the output;
//   - toYaml sorts map keys and trims the final newline; nindent/indent/quote/default/
//     required/fail/trunc/trimSuffix/dict/list/hasKey/empty behave like their sprig
//     namesakes for the argument types the chart uses.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"text/template"
)

func main() {
	chartDir := flag.String("chart", "", "chart directory (holding Chart.yaml and templates/)")
	contextFile := flag.String("context", "", "JSON file with Values, Release, Chart, Capabilities")
	notes := flag.Bool("notes", false, "render templates/NOTES.txt instead of the manifests")
	strict := flag.Bool("strict", false, "fail on a missing map key (like helm lint --strict) "+
		"instead of rendering it empty: catches misspelt .Values paths")
	flag.Parse()
	if *chartDir == "" || *contextFile == "" {
		fmt.Fprintln(os.Stderr, "usage: chart-render -chart DIR -context FILE [-notes] [-strict]")
		os.Exit(2)
	}
	out, err := run(*chartDir, *contextFile, *notes, *strict)
	if err != nil {
		fmt.Fprintf(os.Stderr, "Error: %s\n", helmError(err))
		os.Exit(1)
	}
	os.Stdout.WriteString(out)
}

func run(chartDir, contextFile string, notes, strict bool) (string, error) {
	raw, err := os.ReadFile(contextFile)
	if err != nil {
		return "", err
	}
	var ctx map[string]any
	if err := json.Unmarshal(raw, &ctx); err != nil {
		return "", fmt.Errorf("context %s: %w", contextFile, err)
	}
	chart, _ := ctx["Chart"].(map[string]any)
	chartName, _ := chart["Name"].(string)
	if chartName == "" {
		return "", errors.New("context: Chart.Name is required")
	}
	files, err := templateFiles(chartDir, chartName)
	if err != nil {
		return "", err
	}
	missing := "missingkey=zero"
	if strict {
		missing = "missingkey=error"
	}
	root := template.New("chart").Option(missing)
	root.Funcs(funcMap(root))
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if _, err := root.New(name).Parse(files[name]); err != nil {
			return "", err
		}
	}
	var out strings.Builder
	for _, name := range names {
		base := path.Base(name)
		isNotes := base == "NOTES.txt"
		if notes != isNotes || strings.HasPrefix(base, "_") {
			continue
		}
		if !isNotes && !strings.HasSuffix(base, ".yaml") && !strings.HasSuffix(base, ".yml") {
			continue
		}
		data := map[string]any{}
		for k, v := range ctx {
			data[k] = v
		}
		data["Template"] = map[string]any{
			"Name":     name,
			"BasePath": path.Join(chartName, "templates"),
		}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, data); err != nil {
			return "", err
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if isNotes {
			out.WriteString(text)
			continue
		}
		if strings.TrimSpace(text) == "" {
			continue // a template switched off by its values, as Helm skips it
		}
		fmt.Fprintf(&out, "---\n# Source: %s\n%s", name, strings.TrimLeft(text, "\n"))
		if !strings.HasSuffix(text, "\n") {
			out.WriteString("\n")
		}
	}
	return out.String(), nil
}

// templateFiles reads templates/ (recursively) keyed by Helm's template names:
// "<chart>/templates/<relative path>".
func templateFiles(chartDir, chartName string) (map[string]string, error) {
	dir := filepath.Join(chartDir, "templates")
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		body, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files[path.Join(chartName, "templates", filepath.ToSlash(rel))] = string(body)
		return nil
	})
	return files, err
}

// helmError reprints text/template's execution errors as Helm does:
// "execution error at (<template>:<line>:<col>): <message>". The Go form is
// `template: <template>:<line>:<col>: executing "<name>" at <<call>>: error calling <fn>: <message>`.
func helmError(err error) string {
	text := err.Error()
	const prefix, marker = "template: ", ": error calling "
	rest, ok := strings.CutPrefix(text, prefix)
	at := strings.Index(rest, ": executing ")
	call := strings.Index(rest, marker)
	if !ok || at < 0 || call < at {
		return text
	}
	message := rest[call+len(marker):]
	if fn := strings.Index(message, ": "); fn >= 0 {
		message = message[fn+2:]
	}
	return fmt.Sprintf("execution error at (%s): %s", rest[:at], message)
}

// ---------------------------------------------------------------------------- functions

func funcMap(root *template.Template) template.FuncMap {
	return template.FuncMap{
		"include": func(name string, data any) (string, error) {
			var buf bytes.Buffer
			if err := root.ExecuteTemplate(&buf, name, data); err != nil {
				return "", err
			}
			return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
		},
		"toYaml": func(v any) string { return strings.TrimSuffix(toYAML(v), "\n") },
		"toJson": func(v any) string {
			b, err := marshalJSON(v)
			if err != nil {
				return ""
			}
			return string(b)
		},
		"indent":  indent,
		"nindent": func(n int, s string) string { return "\n" + indent(n, s) },
		"quote": func(args ...any) string {
			out := make([]string, 0, len(args))
			for _, a := range args {
				if a != nil {
					out = append(out, strconv.Quote(toString(a)))
				}
			}
			return strings.Join(out, " ")
		},
		"default": func(d any, given ...any) any {
			if len(given) == 0 || empty(given[0]) {
				return d
			}
			return given[0]
		},
		"empty": empty,
		"required": func(msg string, v any) (any, error) {
			if v == nil {
				return nil, errors.New(msg)
			}
			if s, ok := v.(string); ok && s == "" {
				return nil, errors.New(msg)
			}
			return v, nil
		},
		"fail": func(msg string) (string, error) { return "", errors.New(msg) },
		"trunc": func(n int, s string) string {
			if n >= 0 && len(s) > n {
				return s[:n]
			}
			if n < 0 && len(s) > -n {
				return s[len(s)+n:]
			}
			return s
		},
		"trimSuffix": func(suffix, s string) string { return strings.TrimSuffix(s, suffix) },
		"contains":   func(substr, s string) bool { return strings.Contains(s, substr) },
		"join": func(sep string, v any) string {
			items := toList(v)
			out := make([]string, 0, len(items))
			for _, it := range items {
				if it != nil {
					out = append(out, toString(it))
				}
			}
			return strings.Join(out, sep)
		},
		"has": func(needle any, haystack any) bool {
			for _, it := range toList(haystack) {
				if reflect.DeepEqual(it, needle) {
					return true
				}
			}
			return false
		},
		"dict": func(kv ...any) map[string]any {
			m := map[string]any{}
			for i := 0; i+1 < len(kv); i += 2 {
				m[toString(kv[i])] = kv[i+1]
			}
			if len(kv)%2 == 1 {
				m[toString(kv[len(kv)-1])] = ""
			}
			return m
		},
		"list":     func(v ...any) []any { return v },
		"hasKey":   func(m map[string]any, k string) bool { _, ok := m[k]; return ok },
		"int":      toInt,
		"toString": toString,
	}
}

func indent(n int, s string) string {
	pad := strings.Repeat(" ", n)
	return pad + strings.ReplaceAll(s, "\n", "\n"+pad)
}

// empty is sprig's notion: nil, false, 0, "" and empty collections are empty.
func empty(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return rv.Len() == 0
	case reflect.Bool:
		return !rv.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int() == 0
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return rv.Uint() == 0
	case reflect.Float32, reflect.Float64:
		return rv.Float() == 0
	case reflect.Pointer, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

func toString(v any) string {
	switch t := v.(type) {
	case nil:
		return ""
	case string:
		return t
	case float64:
		return formatFloat(t)
	case []byte:
		return string(t)
	case error:
		return t.Error()
	}
	return fmt.Sprint(v)
}

func toInt(v any) int {
	switch t := v.(type) {
	case int:
		return t
	case int64:
		return int(t)
	case float64:
		return int(t)
	case bool:
		if t {
			return 1
		}
		return 0
	case string:
		if i, err := strconv.Atoi(strings.TrimSpace(t)); err == nil {
			return i
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(t), 64); err == nil {
			return int(f)
		}
	}
	return 0
}

func toList(v any) []any {
	switch t := v.(type) {
	case nil:
		return nil
	case []any:
		return t
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice && rv.Kind() != reflect.Array {
		return []any{v}
	}
	out := make([]any, rv.Len())
	for i := range out {
		out[i] = rv.Index(i).Interface()
	}
	return out
}

// ---------------------------------------------------------------------------- toYaml

// toYAML emits block-style YAML with sorted map keys (as Helm's toYaml does). Strings that
// YAML could read as something else are written as JSON strings, which YAML reads back as
// the same string.
func toYAML(v any) string {
	v = normalize(v)
	if s, ok := scalar(v); ok {
		return s + "\n"
	}
	return strings.Join(yamlLines(v), "\n") + "\n"
}

// normalize turns any map/slice the templates built (dict, list) into map[string]any /
// []any, so the emitter has two container types to handle.
func normalize(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, x := range t {
			out[k] = normalize(x)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			out[i] = normalize(x)
		}
		return out
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Map:
		out := make(map[string]any, rv.Len())
		for _, k := range rv.MapKeys() {
			out[toString(k.Interface())] = normalize(rv.MapIndex(k).Interface())
		}
		return out
	case reflect.Slice, reflect.Array:
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			return string(rv.Bytes())
		}
		out := make([]any, rv.Len())
		for i := range out {
			out[i] = normalize(rv.Index(i).Interface())
		}
		return out
	}
	return v
}

func yamlLines(v any) []string {
	var out []string
	switch t := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			val := t[k]
			key := yamlString(k)
			if s, ok := scalar(val); ok {
				out = append(out, key+": "+s)
				continue
			}
			out = append(out, key+":")
			sub := yamlLines(val)
			if _, isList := val.([]any); isList {
				out = append(out, sub...) // block sequences sit at their key's indentation
				continue
			}
			for _, l := range sub {
				out = append(out, "  "+l)
			}
		}
	case []any:
		for _, item := range t {
			if s, ok := scalar(item); ok {
				out = append(out, "- "+s)
				continue
			}
			sub := yamlLines(item)
			out = append(out, "- "+sub[0])
			for _, l := range sub[1:] {
				out = append(out, "  "+l)
			}
		}
	}
	return out
}

// scalar renders v on one line when it is a scalar or an empty collection.
func scalar(v any) (string, bool) {
	switch t := v.(type) {
	case nil:
		return "null", true
	case bool:
		return strconv.FormatBool(t), true
	case float64:
		return formatFloat(t), true
	case float32:
		return formatFloat(float64(t)), true
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return fmt.Sprint(t), true
	case json.Number:
		return t.String(), true
	case string:
		return yamlString(t), true
	case map[string]any:
		if len(t) == 0 {
			return "{}", true
		}
		return "", false
	case []any:
		if len(t) == 0 {
			return "[]", true
		}
		return "", false
	}
	return yamlString(toString(v)), true
}

func formatFloat(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return strconv.FormatInt(int64(f), 10)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// plainSafe: strings YAML 1.1 and 1.2 both read back as the same string when unquoted:
// [A-Za-z_/] then [A-Za-z0-9_./-], with single colons between such runs ("system:masters").
func plainSafe(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == '/'
		switch {
		case letter:
		case i == 0:
			return false
		case c >= '0' && c <= '9' || c == '.' || c == '-':
		case c == ':':
			if i == len(s)-1 || s[i-1] == ':' || s[i+1] == ':' {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// yamlSpecial: plain words YAML 1.1 resolves to booleans or null.
var yamlSpecial = map[string]bool{
	"y": true, "yes": true, "n": true, "no": true, "true": true, "false": true,
	"on": true, "off": true, "null": true,
}

func yamlString(s string) string {
	if plainSafe(s) && !yamlSpecial[strings.ToLower(s)] {
		return s
	}
	b, err := marshalJSON(s)
	if err != nil {
		return strconv.Quote(s)
	}
	return string(b)
}

func marshalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
