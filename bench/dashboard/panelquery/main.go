// panelquery evaluates dashboard queries over recorded scrapes with Prometheus's own storage
// and query engine, so a rendered dashboard shows what Prometheus would answer.
//
//	panelquery -scrapes DIR -queries FILE -step 2s > series.json
//
// DIR holds one directory per scraped target, named "<namespace>__<pod>", each holding
// "<unix milliseconds>.prom" files in the Prometheus text format; every sample gets the labels
// namespace and pod, as a Kubernetes scrape would add them. FILE is a JSON list of
// {"id": "...", "expr": "..."}; the answer maps each id to its series over the recorded span.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/tsdb"
)

type query struct {
	ID   string `json:"id"`
	Expr string `json:"expr"`
}

type series struct {
	Metric map[string]string `json:"metric"`
	Values [][2]float64      `json:"values"`
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "panelquery: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	scrapes := flag.String("scrapes", "", "directory of scraped targets")
	queries := flag.String("queries", "", "JSON file of queries")
	step := flag.Duration("step", 2*time.Second, "resolution of the answer")
	flag.Parse()

	tmp, err := os.MkdirTemp("", "panelquery-")
	if err != nil {
		fail("%v", err)
	}
	defer os.RemoveAll(tmp)
	opts := tsdb.DefaultOptions()
	opts.OutOfOrderTimeWindow = math.MaxInt64 / 2
	db, err := tsdb.Open(tmp, nil, nil, opts, nil)
	if err != nil {
		fail("open tsdb: %v", err)
	}
	defer db.Close()

	targets, err := os.ReadDir(*scrapes)
	if err != nil {
		fail("%v", err)
	}
	var first, last int64 = math.MaxInt64, 0
	ctx := context.Background()
	for _, target := range targets {
		ns, pod, ok := strings.Cut(target.Name(), "__")
		if !target.IsDir() || !ok {
			continue
		}
		files, _ := filepath.Glob(filepath.Join(*scrapes, target.Name(), "*.prom"))
		sort.Strings(files)
		for _, file := range files {
			ms, err := strconv.ParseInt(strings.TrimSuffix(filepath.Base(file), ".prom"), 10, 64)
			if err != nil {
				continue
			}
			first, last = min(first, ms), max(last, ms)
			f, err := os.Open(file)
			if err != nil {
				fail("%v", err)
			}
			parser := expfmt.NewTextParser(model.UTF8Validation)
			families, err := parser.TextToMetricFamilies(f)
			f.Close()
			if err != nil {
				fail("%s: %v", file, err)
			}
			app := db.Appender(ctx)
			put := func(name string, m *dto.Metric, extra map[string]string, v float64) {
				b := labels.NewBuilder(labels.EmptyLabels())
				b.Set("__name__", name)
				b.Set("namespace", ns)
				b.Set("pod", pod)
				for _, lp := range m.GetLabel() {
					b.Set(lp.GetName(), lp.GetValue())
				}
				for k, val := range extra {
					b.Set(k, val)
				}
				if _, err := app.Append(0, b.Labels(), ms, v); err != nil {
					fail("%s: append %s: %v", file, name, err)
				}
			}
			for name, fam := range families {
				for _, m := range fam.GetMetric() {
					switch fam.GetType() {
					case dto.MetricType_COUNTER:
						put(name, m, nil, m.GetCounter().GetValue())
					case dto.MetricType_GAUGE:
						put(name, m, nil, m.GetGauge().GetValue())
					case dto.MetricType_UNTYPED:
						put(name, m, nil, m.GetUntyped().GetValue())
					case dto.MetricType_HISTOGRAM:
						h := m.GetHistogram()
						for _, bucket := range h.GetBucket() {
							le := strconv.FormatFloat(bucket.GetUpperBound(), 'g', -1, 64)
							put(name+"_bucket", m, map[string]string{"le": le}, float64(bucket.GetCumulativeCount()))
						}
						put(name+"_bucket", m, map[string]string{"le": "+Inf"}, float64(h.GetSampleCount()))
						put(name+"_sum", m, nil, h.GetSampleSum())
						put(name+"_count", m, nil, float64(h.GetSampleCount()))
					}
				}
			}
			if err := app.Commit(); err != nil {
				fail("%s: commit: %v", file, err)
			}
		}
	}
	if last == 0 {
		fail("no scrapes under %s", *scrapes)
	}

	raw, err := os.ReadFile(*queries)
	if err != nil {
		fail("%v", err)
	}
	var qs []query
	if err := json.Unmarshal(raw, &qs); err != nil {
		fail("%s: %v", *queries, err)
	}
	// A target that stops being scraped (a replica that exited) must end its series, as
	// Prometheus's staleness markers end them: the lookback is a little over one scrape.
	engine := promql.NewEngine(promql.EngineOpts{
		MaxSamples: 50_000_000, Timeout: time.Minute, LookbackDelta: 2*(*step) + time.Second,
	})
	start, end := time.UnixMilli(first), time.UnixMilli(last)
	answer := map[string][]series{}
	for _, q := range qs {
		rq, err := engine.NewRangeQuery(ctx, db, nil, q.Expr, start, end, *step)
		if err != nil {
			fail("%s: %v", q.ID, err)
		}
		res := rq.Exec(ctx)
		if res.Err != nil {
			fail("%s: %v", q.ID, res.Err)
		}
		matrix, err := res.Matrix()
		if err != nil {
			fail("%s: %v", q.ID, err)
		}
		out := []series{}
		for _, s := range matrix {
			one := series{Metric: s.Metric.Map()}
			for _, p := range s.Floats {
				if math.IsNaN(p.F) || math.IsInf(p.F, 0) {
					continue // no data at that step (a quantile of nothing); JSON has no NaN
				}
				one.Values = append(one.Values, [2]float64{float64(p.T) / 1000, p.F})
			}
			out = append(out, one)
		}
		answer[q.ID] = out
		rq.Close()
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(map[string]any{"start": float64(first) / 1000, "end": float64(last) / 1000, "series": answer}); err != nil {
		fail("%v", err)
	}
}
