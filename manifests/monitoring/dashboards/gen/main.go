// Command gen writes Frota's Grafana dashboards (fleet.json, operator.json) with Grafana's
// Apache-licensed Foundation SDK, and checks dashboard JSON against the SDK's schema types.
//
//	go run . -out ..                     # rewrite ../fleet.json and ../operator.json
//	go run . -check ../fleet.json ...    # strict unmarshal + Validate, one line per file
//
// Every query groups by the labels manifests/monitoring/scrape.yaml sets: namespace,
// inferenceservice (app.kubernetes.io/instance), pod and role. tests/monitoring checks that
// each metric a query names is one Frota exports; e2e/test_monitoring.py runs each query
// against a Prometheus scraping a fleet.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

func main() {
	out := flag.String("out", "", "directory to write fleet.json and operator.json into")
	check := flag.Bool("check", false, "check the JSON files given as arguments instead")
	flag.Parse()
	if *check {
		os.Exit(checkFiles(flag.Args()))
	}
	if *out == "" {
		fmt.Fprintln(os.Stderr, "gen: give -out DIR or -check FILE...")
		os.Exit(2)
	}
	for name, builder := range map[string]*dashboard.DashboardBuilder{
		"fleet.json": fleet(), "operator.json": operator(),
	} {
		if err := write(filepath.Join(*out, name), builder); err != nil {
			fmt.Fprintf(os.Stderr, "gen: %s: %v\n", name, err)
			os.Exit(1)
		}
	}
}

func write(path string, builder cog.Builder[dashboard.Dashboard]) error {
	board, err := builder.Build()
	if err != nil {
		return err
	}
	if err := orNil(board.Validate()); err != nil {
		return err
	}
	data, err := json.MarshalIndent(board, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// checkFiles strictly unmarshals each file into the SDK's Dashboard (unknown or mistyped
// fields fail) and validates it; panels and queries decode through the SDK's plugins.
func checkFiles(paths []string) int {
	plugins.RegisterDefaultPlugins()
	failed := 0
	for _, path := range paths {
		raw, err := os.ReadFile(path)
		if err == nil {
			board := &dashboard.Dashboard{}
			if err = orNil(board.UnmarshalJSONStrict(raw)); err == nil {
				err = orNil(board.Validate())
			}
			if err == nil && !bytes.Contains(raw, []byte(`"panels"`)) {
				err = fmt.Errorf("no panels")
			}
		}
		if err != nil {
			fmt.Printf("FAIL %s: %v\n", path, err)
			failed++
			continue
		}
		fmt.Printf("ok %s\n", path)
	}
	if failed > 0 {
		return 1
	}
	return 0
}

// orNil is nil for an empty cog.BuildErrors: the SDK returns that typed nil as an error.
func orNil(err error) error {
	if errs, ok := err.(cog.BuildErrors); ok && len(errs) == 0 {
		return nil
	}
	return err
}
