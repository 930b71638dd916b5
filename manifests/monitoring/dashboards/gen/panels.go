package main

import (
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// datasource is the dashboard's Prometheus, picked by the ${datasource} variable.
func datasource() common.DataSourceRef {
	kind, uid := "prometheus", "${datasource}"
	return common.DataSourceRef{Type: &kind, Uid: &uid}
}

func datasourceVariable() *dashboard.DatasourceVariableBuilder {
	return dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus")
}

// labelVariable is a multi-value variable over one label of `metric` (all by default).
func labelVariable(name, label, title, metric string) *dashboard.QueryVariableBuilder {
	query := "label_values(" + metric + ", " + label + ")"
	return dashboard.NewQueryVariableBuilder(name).
		Label(title).
		Datasource(datasource()).
		Query(dashboard.StringOrMap{Map: map[string]any{"query": query, "refId": "vars"}}).
		Definition(query).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
		Sort(dashboard.VariableSortAlphabeticalAsc).
		Multi(true).
		IncludeAll(true).
		AllValue(".*")
}

type query struct {
	expr, legend string
}

func q(expr, legend string) query { return query{expr, legend} }

// panel is a time series of one or more queries, half the dashboard wide.
func panel(title, description, unit string, queries ...query) *timeseries.PanelBuilder {
	builder := timeseries.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(datasource()).
		Unit(unit).
		Min(0).
		Height(8).
		Span(12)
	for _, one := range queries {
		builder.WithTarget(prometheus.NewDataqueryBuilder().
			Expr(one.expr).
			LegendFormat(one.legend).
			Datasource(datasource()))
	}
	return builder
}

func row(title string) cog.Builder[dashboard.RowPanel] {
	return dashboard.NewRowBuilder(title)
}
