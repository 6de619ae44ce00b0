// rulecheck validates Prometheus rule files the way Prometheus loads them: the YAML shape
// (unknown fields are errors), every expression parsed as PromQL, every label and annotation
// template parsed, `for` durations read. It is `promtool check rules` without promtool's
// service-discovery dependencies, built from the Prometheus Go module by the tests.
package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: rulecheck FILE...")
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	failed := false
	for _, file := range os.Args[1:] {
		groups, errs := rulefmt.ParseFile(
			file, false, model.UTF8Validation, parser.NewParser(parser.Options{}), logger,
		)
		for _, err := range errs {
			fmt.Fprintln(os.Stderr, err)
			failed = true
		}
		if groups == nil {
			continue
		}
		rules := 0
		for _, g := range groups.Groups {
			rules += len(g.Rules)
		}
		fmt.Printf("%s: %d groups, %d rules\n", file, len(groups.Groups), rules)
	}
	if failed {
		os.Exit(1)
	}
}
