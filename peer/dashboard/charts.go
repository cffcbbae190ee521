package dashboard

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"net/http"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/holopeer/holopeer/peer/api"
)

// Bounds on chart work: a curve of a million points is drawn from at most
// maxChartPoints of them, and the cache of drawn charts stays small.
const (
	maxChartPoints       = 1000
	maxChartCache        = 64
	maxJobsTracked       = 32
	maxThroughputSamples = 2000
	maxJobIDLen          = 256
	chartWidth           = 16 * vg.Centimeter
	chartHeight          = 7 * vg.Centimeter
)

type chartKey struct {
	kind, job, version string
}

var (
	lossColor       = color.RGBA{R: 0x25, G: 0x63, B: 0xeb, A: 0xff}
	throughputColor = color.RGBA{R: 0x05, G: 0x96, B: 0x69, A: 0xff}
	barColor        = color.RGBA{R: 0x7c, G: 0x3a, B: 0xed, A: 0xff}
	gridColor       = color.Gray{Y: 0xe5}
	sansFont        = font.Font{Typeface: "Liberation", Variant: "Sans"}
)

// newPlot is a plot in the page's style: sans-serif text, a light grid, no
// background but the card's white.
func newPlot(xLabel, yLabel string) *plot.Plot {
	p := plot.New()
	p.BackgroundColor = color.White // vgsvg writes a broken colour for a transparent one
	for _, ax := range []*plot.Axis{&p.X, &p.Y} {
		ax.Label.TextStyle.Font = font.From(sansFont, 11)
		ax.Tick.Label.Font = font.From(sansFont, 10)
		ax.Color = color.Gray{Y: 0x88}
		ax.Tick.Color = color.Gray{Y: 0x88}
	}
	p.X.Label.Text, p.Y.Label.Text = xLabel, yLabel
	g := plotter.NewGrid()
	g.Vertical.Color, g.Horizontal.Color = gridColor, gridColor
	p.Add(g)
	return p
}

// downsample keeps at most n points: the mean of each of n buckets, and
// always the last point, so the curve ends where the job is.
func downsample(pts []api.Point, n int) plotter.XYs {
	out := make(plotter.XYs, 0, min(len(pts), n))
	finite := func(p api.Point) bool {
		return !math.IsNaN(p.X) && !math.IsInf(p.X, 0) && !math.IsNaN(p.Y) && !math.IsInf(p.Y, 0)
	}
	if len(pts) <= n {
		for _, p := range pts {
			if finite(p) {
				out = append(out, plotter.XY{X: p.X, Y: p.Y})
			}
		}
		return out
	}
	per := float64(len(pts)-1) / float64(n-1)
	for b := 0; b < n-1; b++ {
		lo, hi := int(float64(b)*per), int(float64(b+1)*per)
		var sx, sy float64
		k := 0
		for _, p := range pts[lo:max(hi, lo+1)] {
			if finite(p) {
				sx, sy, k = sx+p.X, sy+p.Y, k+1
			}
		}
		if k > 0 {
			out = append(out, plotter.XY{X: sx / float64(k), Y: sy / float64(k)})
		}
	}
	if last := pts[len(pts)-1]; finite(last) {
		out = append(out, plotter.XY{X: last.X, Y: last.Y})
	}
	return out
}

// lineSVG draws one curve. With few points each is marked, so a curve of
// one or two points is visible. fromZero starts the y axis at 0, for
// figures whose small wobbles should not look like swings.
func lineSVG(pts []api.Point, xLabel, yLabel string, c color.Color, fromZero bool) ([]byte, int, error) {
	xys := downsample(pts, maxChartPoints)
	p := newPlot(xLabel, yLabel)
	if len(xys) > 0 {
		line, err := plotter.NewLine(xys)
		if err != nil {
			return nil, 0, err
		}
		line.Color, line.Width = c, vg.Points(1.8)
		p.Add(line)
		if len(xys) <= 60 {
			sc, err := plotter.NewScatter(xys)
			if err != nil {
				return nil, 0, err
			}
			sc.Color, sc.Radius, sc.Shape = c, vg.Points(2.2), draw.CircleGlyph{}
			p.Add(sc)
		}
		if fromZero {
			p.Y.Min = min(0, p.Y.Min)
			p.Y.Max += 0.1 * (p.Y.Max - p.Y.Min)
		}
	} else {
		p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = 0, 1, 0, 1
	}
	b, err := render(p)
	return b, len(xys), err
}

func render(p *plot.Plot) ([]byte, error) {
	c := vgsvg.NewWith(vgsvg.UseWH(chartWidth, chartHeight))
	p.Draw(draw.New(c))
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// chartCSP: an SVG served to an <img> runs no script; this also holds if
// someone opens it directly.
const chartCSP = "default-src 'none'; style-src 'unsafe-inline'"

func writeSVG(w http.ResponseWriter, b []byte, points int) {
	h := w.Header()
	h.Set("Content-Type", "image/svg+xml")
	h.Set("Content-Security-Policy", chartCSP)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Chart-Points", strconv.Itoa(points))
	w.Write(b)
}

// drawnChart is a chart in the cache.
type drawnChart struct {
	svg    []byte
	points int
}

// cachedChart returns a drawn chart or draws it.
func (d *Dashboard) cachedChart(k chartKey, draw func() ([]byte, int, error)) ([]byte, int, error) {
	d.mu.Lock()
	c, ok := d.charts[k]
	d.mu.Unlock()
	if ok {
		return c.svg, c.points, nil
	}
	svg, n, err := draw()
	if err != nil {
		return nil, 0, err
	}
	d.mu.Lock()
	if len(d.charts) >= maxChartCache {
		clear(d.charts)
	}
	d.charts[k] = drawnChart{svg, n}
	d.mu.Unlock()
	return svg, n, nil
}

func (d *Dashboard) findJob(w http.ResponseWriter, r *http.Request) (api.JobStatus, bool) {
	id := r.URL.Query().Get("job")
	if id == "" || len(id) > maxJobIDLen {
		http.Error(w, "dashboard: ?job=ID required", http.StatusBadRequest)
		return api.JobStatus{}, false
	}
	for _, j := range d.src.Jobs() {
		if j.JobID == id {
			return j, true
		}
	}
	http.Error(w, fmt.Sprintf("dashboard: no job %q", id), http.StatusNotFound)
	return api.JobStatus{}, false
}

func (d *Dashboard) serveLoss(w http.ResponseWriter, r *http.Request) {
	j, ok := d.findJob(w, r)
	if !ok {
		return
	}
	version := strconv.Itoa(len(j.Loss))
	if n := len(j.Loss); n > 0 {
		version += fmt.Sprintf("-%g-%g", j.Loss[n-1].X, j.Loss[n-1].Y)
	}
	b, n, err := d.cachedChart(chartKey{"loss", j.JobID, version}, func() ([]byte, int, error) {
		return lineSVG(j.Loss, "step", "loss", lossColor, false)
	})
	if err != nil {
		http.Error(w, "dashboard: loss chart: "+err.Error(), http.StatusInternalServerError)
		return
	}
	writeSVG(w, b, n)
}

func (d *Dashboard) serveThroughput(w http.ResponseWriter, r *http.Request) {
	j, ok := d.findJob(w, r)
	if !ok {
		return
	}
	d.mu.Lock()
	d.history.add(j.JobID, j.Step, j.TokensPerS)
	pts := d.history.points(j.JobID)
	d.mu.Unlock()
	version := strconv.Itoa(len(pts))
	if n := len(pts); n > 0 {
		version += fmt.Sprintf("-%g-%g", pts[n-1].X, pts[n-1].Y)
	}
	b, n, err := d.cachedChart(chartKey{"throughput", j.JobID, version}, func() ([]byte, int, error) {
		return lineSVG(pts, "step", "tokens/s", throughputColor, true)
	})
	if err != nil {
		http.Error(w, "dashboard: throughput chart: "+err.Error(), http.StatusInternalServerError)
		return
	}
	writeSVG(w, b, n)
}

// serveBytes draws bytes sent per codec, summed over jobs.
func (d *Dashboard) serveBytes(w http.ResponseWriter, r *http.Request) {
	st, _ := d.state()
	version := fmt.Sprint(st.Bytes)
	b, n, err := d.cachedChart(chartKey{"bytes", "", version}, func() ([]byte, int, error) {
		return bytesSVG(st.Bytes)
	})
	if err != nil {
		http.Error(w, "dashboard: bytes chart: "+err.Error(), http.StatusInternalServerError)
		return
	}
	writeSVG(w, b, n)
}

func bytesSVG(cb []CodecBytes) ([]byte, int, error) {
	p := newPlot("", "MiB sent")
	if len(cb) == 0 {
		p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = 0, 1, 0, 1
		b, err := render(p)
		return b, 0, err
	}
	cb = cb[:min(len(cb), 8)]
	vals := make(plotter.Values, len(cb))
	names := make([]string, len(cb))
	for i, c := range cb {
		vals[i] = float64(c.Bytes) / (1 << 20)
		names[i] = c.Codec
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(28))
	if err != nil {
		return nil, 0, err
	}
	bars.Color, bars.LineStyle.Width = barColor, 0
	p.Add(bars)
	p.Y.Max *= 1.1
	p.NominalX(names...)
	p.X.Tick.Label.Font = font.From(sansFont, 10)
	b, err := render(p)
	return b, len(cb), err
}

// throughputHistory remembers each job's tokens/s by step, since jobs
// report only the current figure. Callers hold the dashboard's mutex.
type throughputHistory struct {
	maxJobs, maxSamples int
	jobs                map[string][]api.Point
	order               []string // least recently added first
}

func newThroughputHistory(maxJobs, maxSamples int) *throughputHistory {
	return &throughputHistory{maxJobs: maxJobs, maxSamples: maxSamples, jobs: map[string][]api.Point{}}
}

func (h *throughputHistory) add(job string, step int, tps float64) {
	if job == "" || len(job) > maxJobIDLen || math.IsNaN(tps) || math.IsInf(tps, 0) || tps <= 0 {
		return
	}
	pts, ok := h.jobs[job]
	if ok && len(pts) > 0 && pts[len(pts)-1].X >= float64(step) {
		return // one sample per step; steps only go forward
	}
	if !ok && len(h.jobs) >= h.maxJobs {
		oldest := h.order[0]
		h.order = h.order[1:]
		delete(h.jobs, oldest)
	}
	if !ok {
		h.order = append(h.order, job)
	}
	pts = append(pts, api.Point{X: float64(step), Y: tps})
	if len(pts) > h.maxSamples {
		pts = append(pts[:0:0], pts[len(pts)-h.maxSamples:]...)
	}
	h.jobs[job] = pts
}

func (h *throughputHistory) points(job string) []api.Point {
	return append([]api.Point(nil), h.jobs[job]...)
}

func (h *throughputHistory) len(job string) int { return len(h.jobs[job]) }
