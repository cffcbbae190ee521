// Package browsertest checks a running dashboard in a real browser:
// headless Chromium (Debian's chromium package) loads the page, waits until
// it shows the fleet, a coordinator and a loss curve, checks that the page
// asked nothing of any other host and logged no error, and saves
// screenshots at desktop and phone sizes.
//
// Tests of the dashboard package use it on an in-process source; a swarm
// test points it at a node of a running `holopeer testnet`:
//
//	res, err := browsertest.Check(ctx, "http://127.0.0.1:7601/", browsertest.Expect{Nodes: 4, MinLossPoints: 2, Coordinator: true}, browsertest.Options{Dir: t.TempDir()})
package browsertest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// ErrNoChromium says no Chromium binary was found; tests skip on it.
var ErrNoChromium = errors.New("no chromium binary (install Debian's chromium package, or set HOLOPEER_CHROMIUM)")

// FindChromium returns the browser to drive: $HOLOPEER_CHROMIUM, else the
// first of chromium, chromium-browser, google-chrome on PATH.
func FindChromium() (string, error) {
	if p := os.Getenv("HOLOPEER_CHROMIUM"); p != "" {
		return p, nil
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", ErrNoChromium
}

// Expect is what the page must show before the check passes.
type Expect struct {
	Nodes         int  // fleet rows at least (this node included)
	MinLossPoints int  // points of at least one job's loss curve
	Coordinator   bool // a coordinator with a term
	Insecure      bool // the coordinator marked INSECURE (a sim testnet)
}

// Options tune the check. Zero values take the defaults.
type Options struct {
	Dir     string        // where screenshots go (required)
	Name    string        // screenshot name prefix (default "dashboard")
	Timeout time.Duration // for the page to show what Expect asks (default 60 s)
	Chrome  string        // browser binary (default FindChromium)
}

// Result says what the page showed and where the screenshots are.
type Result struct {
	Desktop, Phone string // PNG paths
	Seen           Seen
}

// Seen is the page's content as the check last read it.
type Seen struct {
	Rows       int    `json:"rows"`
	LossPoints int    `json:"points"`
	Term       int    `json:"term"`
	Insecure   bool   `json:"insecure"`
	Live       string `json:"live"`
	Overflow   bool   `json:"overflow"` // wider than the viewport (horizontal scrolling)
}

// seenJS reads the page as a person would see it: fleet rows, a loss chart
// that has loaded (an <img> with a decoded picture), the coordinator's term.
const seenJS = `(() => {
  const img = [...document.querySelectorAll('img.loss')].find(i => !i.hidden && i.complete && i.naturalWidth > 0);
  const coord = document.querySelector('#coordinator');
  return {
    rows: document.querySelectorAll('#fleet tbody tr[data-peer]').length,
    points: img ? Number(img.dataset.points || 0) : 0,
    term: Number((coord && coord.dataset.term) || 0),
    insecure: !!document.querySelector('#insecure'),
    live: (document.querySelector('#live') || {dataset: {}}).dataset.state || '',
    overflow: document.documentElement.scrollWidth > window.innerWidth + 1,
  };
})()`

// Check loads pageURL in headless Chromium and waits until it shows what
// exp asks, then saves a desktop (1280 wide) and a phone (390 wide)
// screenshot. It fails if the page requested another host, logged an
// error or an exception, or scrolls sideways on a phone.
func Check(ctx context.Context, pageURL string, exp Expect, o Options) (Result, error) {
	if o.Dir == "" {
		return Result{}, errors.New("browsertest: Options.Dir is required")
	}
	if o.Name == "" {
		o.Name = "dashboard"
	}
	if o.Timeout <= 0 {
		o.Timeout = 60 * time.Second
	}
	if o.Chrome == "" {
		var err error
		if o.Chrome, err = FindChromium(); err != nil {
			return Result{}, err
		}
	}
	page, err := url.Parse(pageURL)
	if err != nil {
		return Result{}, fmt.Errorf("browsertest: %w", err)
	}

	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(o.Chrome),
		chromedp.NoSandbox, // root in CI containers
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 900),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("font-render-hinting", "none"),
	)...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	if err := chromedp.Do(bctx); err != nil {
		return Result{}, fmt.Errorf("browsertest: start %s: %w", o.Chrome, err)
	}

	var (
		mu       sync.Mutex
		foreign  []string
		problems []string
	)
	if err := chromedp.Listen(bctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok {
			u, err := url.Parse(e.Request.URL)
			if err != nil || (u.Scheme != "data" && u.Host != page.Host) {
				mu.Lock()
				foreign = append(foreign, e.Request.URL)
				mu.Unlock()
			}
		}
	}); err != nil {
		return Result{}, fmt.Errorf("browsertest: listen: %w", err)
	}
	go func() {
		for m, err := range chromedp.Console(bctx) {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				mu.Lock()
				problems = append(problems, m.String())
				mu.Unlock()
			}
		}
	}()

	var res Result
	wait := func(what string) error {
		wctx, cancel := context.WithTimeout(bctx, o.Timeout)
		defer cancel()
		_, err := chromedp.Run(wctx, chromedp.Poll[bool](
			"(() => { const s = "+seenJS+"; return "+exp.js()+"; })()",
			chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(o.Timeout)))
		seen, serr := chromedp.Run(bctx, chromedp.Evaluate[Seen](seenJS))
		if serr == nil {
			res.Seen = seen
		}
		if err != nil {
			mu.Lock()
			logged := strings.Join(problems, " | ")
			mu.Unlock()
			return fmt.Errorf("browsertest: %s: the page did not show %+v within %s; it shows %+v (console errors: %q): %w", what, exp, o.Timeout, res.Seen, logged, err)
		}
		return nil
	}
	shot := func(suffix string) (string, error) {
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			return "", fmt.Errorf("browsertest: screenshot: %w", err)
		}
		path := filepath.Join(o.Dir, o.Name+"-"+suffix+".png")
		return path, os.WriteFile(path, png, 0o644)
	}

	if err := chromedp.Do(bctx, chromedp.Navigate(pageURL)); err != nil {
		return res, fmt.Errorf("browsertest: load %s: %w", pageURL, err)
	}
	if err := wait("desktop"); err != nil {
		shot("failed") // for the person reading the failure
		return res, err
	}
	if res.Desktop, err = shot("desktop"); err != nil {
		return res, err
	}

	// A phone: 390 CSS pixels wide, as an iPhone 12 to 15.
	if err := chromedp.Do(bctx, chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile, chromedp.EmulateTouch)); err != nil {
		return res, fmt.Errorf("browsertest: phone viewport: %w", err)
	}
	if err := wait("phone"); err != nil {
		return res, err
	}
	if res.Phone, err = shot("phone"); err != nil {
		return res, err
	}

	mu.Lock()
	defer mu.Unlock()
	var errs []error
	if res.Seen.Overflow {
		errs = append(errs, errors.New("browsertest: on a phone the page is wider than the screen"))
	}
	if len(foreign) > 0 {
		errs = append(errs, fmt.Errorf("browsertest: the page requested other hosts: %s", strings.Join(foreign, ", ")))
	}
	if len(problems) > 0 {
		errs = append(errs, fmt.Errorf("browsertest: the page logged errors: %s", strings.Join(problems, " | ")))
	}
	return res, errors.Join(errs...)
}

// js is exp as a JavaScript condition on s (a Seen).
func (e Expect) js() string {
	return fmt.Sprintf("s.rows >= %d && s.points >= %d && (%t ? s.term > 0 : true) && (%t ? s.insecure : true)",
		e.Nodes, e.MinLossPoints, e.Coordinator, e.Insecure)
}
