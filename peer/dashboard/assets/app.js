// holopeer dashboard: renders the node's state and keeps it live from
// server-sent events, polling state.json when streams are unavailable.
// Text from the network is only ever set as text (never as HTML).
'use strict';
(function () {
  const STATE = '/dashboard/state.json';
  const EVENTS = '/dashboard/events';
  const POLL_MS = 2000;

  const $ = (sel, root) => (root || document).querySelector(sel);

  // el builds an element; children are nodes or text.
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null) continue;
      if (k === 'class') e.className = v;
      else if (k.startsWith('data-') || k === 'title') e.setAttribute(k, String(v));
      else e[k] = v;
    }
    for (const c of children) {
      if (c === undefined || c === null) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  const short = (id) => (id && id.length > 18 ? id.slice(0, 8) + '…' + id.slice(-6) : id || '—');
  const peer = (id) => el('span', { class: 'peer', title: id }, short(id));
  const badge = (cls, text, title) => el('span', { class: 'badge ' + cls, title: title }, text);

  function bytes(n) {
    if (!n) return '0 B';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n : n.toFixed(n < 10 ? 2 : 1)) + ' ' + u[i];
  }
  function num(n, digits) {
    if (n === undefined || n === null || !isFinite(n)) return '—';
    return Number(n).toLocaleString(undefined, { maximumFractionDigits: digits === undefined ? 1 : digits });
  }
  function dur(s) {
    if (!s) return '0 s';
    if (s < 120) return num(s, 0) + ' s';
    if (s < 7200) return num(s / 60, 1) + ' min';
    return num(s / 3600, 1) + ' h';
  }

  function connBadge(row) {
    if (row.conn === 'self') return badge('plain', 'this node');
    if (row.conn === 'direct') return badge('ok', 'direct');
    if (row.conn === 'relayed') return badge('warn', 'relayed', row.relay_reason || 'through a relay');
    return badge('plain', row.conn || 'unknown');
  }
  function teeBadge(row) {
    if (row.insecure) return badge('bad', 'sim · INSECURE', 'simulated attestation: testnets only');
    if (row.attested) return badge('ok', row.tee + ' ✓');
    return badge('plain', 'no');
  }

  // fill replaces a table body with rows of [label, content] cells.
  function fill(tbody, rows) {
    tbody.replaceChildren(...rows);
  }
  function row(props, cells) {
    const tr = el('tr', props);
    for (const [label, content, cls] of cells) tr.append(el('td', { 'data-label': label, class: cls }, content));
    return tr;
  }

  function renderCoordinator(s) {
    const box = $('#coordinator');
    const c = s.coordinator;
    if (!c) {
      box.dataset.term = '0';
      box.replaceChildren(el('p', { class: 'muted' }, 'No coordinator followed yet.'));
      return;
    }
    box.dataset.term = String(c.term);
    box.dataset.peer = c.peer_id;
    const head = el('div', {}, el('span', { class: 'term' }, 'term ' + c.term), ' ');
    const facts = el('dl', { class: 'facts' },
      el('dt', {}, 'peer'), el('dd', {}, peer(c.peer_id), c.self ? ' (this node)' : ''),
      el('dt', {}, 'attestation'), el('dd', {}, c.tee || 'none'),
      el('dt', {}, 'lease'), el('dd', {}, c.lease_left_s > 0 ? dur(c.lease_left_s) + ' left' : 'lapsed'));
    const parts = [head, facts];
    if (c.insecure) {
      parts.splice(1, 0, el('p', { class: 'badge insecure', id: 'insecure' }, 'INSECURE: sim attestation, testnets only'));
    }
    box.replaceChildren(...parts);
  }

  function renderSummary(s) {
    const fleet = s.fleet || [];
    const others = fleet.filter((r) => !r.self);
    const direct = others.filter((r) => r.conn === 'direct').length;
    const attested = fleet.filter((r) => r.attested && !r.insecure).length;
    const insecure = fleet.filter((r) => r.insecure).length;
    const lends = fleet.reduce((a, r) => a + (r.memory_bytes || 0), 0);
    const gflops = fleet.reduce((a, r) => a + (r.gflops || 0), 0);
    const tps = (s.jobs || []).filter((j) => j.state === 'running').reduce((a, j) => a + (j.tokens_per_s || 0), 0);
    $('#summary').replaceChildren(
      el('dt', {}, 'machines'), el('dd', {}, fleet.length),
      el('dt', {}, 'connections'), el('dd', {}, direct + ' direct, ' + (others.length - direct) + ' relayed'),
      el('dt', {}, 'attested'), el('dd', {}, attested + (insecure ? ' (+' + insecure + ' sim)' : '')),
      el('dt', {}, 'memory lent'), el('dd', {}, bytes(lends)),
      el('dt', {}, 'compute'), el('dd', {}, num(gflops, 0) + ' GFLOPS'),
      el('dt', {}, 'throughput'), el('dd', {}, num(tps, 0) + ' tokens/s'));
  }

  function renderNode(s) {
    const n = s.node;
    $('#swarm').textContent = n.swarm || '—';
    $('#node').replaceChildren(
      el('dt', {}, 'peer'), el('dd', {}, peer(n.peer_id)),
      el('dt', {}, 'reachability'), el('dd', {}, n.reachability || 'unknown'),
      el('dt', {}, 'backend'), el('dd', {}, n.backend || '—'),
      el('dt', {}, 'attestation'), el('dd', {}, n.tee || 'none'),
      el('dt', {}, 'version'), el('dd', {}, n.version || '—'));
    $('#warnings').replaceChildren(...(s.warnings || []).map((w) => el('li', {}, w)));
  }

  function renderFleet(s) {
    const rows = (s.fleet || []).map((r) => row({ 'data-peer': r.peer_id, class: r.self ? 'self' : '' }, [
      ['peer', el('span', {}, peer(r.peer_id), r.coordinator ? ' ' : '', r.coordinator ? badge('info', 'coordinator') : ''), 'full'],
      ['platform', r.platform || '—'],
      ['backend', r.backend || '—'],
      ['GFLOPS', r.gflops ? num(r.gflops, 0) : '—', 'num'],
      ['lends', r.memory_bytes ? bytes(r.memory_bytes) : '—', 'num'],
      ['reachability', r.reachability || 'unknown'],
      ['connection', connBadge(r)],
      ['attested', teeBadge(r)],
    ]));
    fill($('#fleet tbody'), rows);
    $('#fleet-count').textContent = '(' + rows.length + ')';
  }

  // setChart swaps an <img> to url once the new image has loaded, so a
  // chart never blanks while it updates.
  function setChart(img, url, points) {
    if (img.dataset.src === url) return;
    img.dataset.src = url;
    const next = new Image();
    next.onload = () => {
      if (img.dataset.src !== url) return;
      img.src = url;
      img.dataset.points = String(points);
      img.hidden = false;
    };
    next.src = url;
  }

  function jobCard(j) {
    const card = el('article', { class: 'card job', 'data-job': j.job_id },
      el('header', {}, el('h3', { class: 'name' }), el('span', { class: 'state' })),
      el('progress', { max: 1, value: 0 }),
      el('div', { class: 'stats' }),
      el('div', { class: 'charts' },
        el('figure', {}, el('figcaption', {}, 'loss by step'), el('img', { class: 'chart loss', alt: 'loss curve', hidden: true })),
        el('figure', {}, el('figcaption', {}, 'tokens/s by step'), el('img', { class: 'chart throughput', alt: 'throughput curve', hidden: true }))),
      el('details', {}, el('summary', {}, 'stages'),
        el('table', { class: 'plain stages' }, el('thead', {}, el('tr', {}, el('th', {}, 'stage'), el('th', {}, 'blocks'), el('th', {}, 'replicas'), el('th', {}, 'path'))), el('tbody'))));
    return card;
  }

  function stat(k, v) { return el('div', { class: 'stat' }, el('div', { class: 'k' }, k), el('div', { class: 'v' }, v)); }

  function renderJobs(s) {
    const box = $('#jobs');
    const jobs = s.jobs || [];
    $('#no-jobs').hidden = jobs.length > 0;
    const seen = new Set();
    for (const j of jobs) {
      seen.add(j.job_id);
      let card = box.querySelector('article[data-job="' + CSS.escape(j.job_id) + '"]');
      if (!card) { card = jobCard(j); box.append(card); }
      $('.name', card).textContent = j.name || j.job_id;
      const cls = { running: 'ok', done: 'info', failed: 'bad', recovering: 'warn' }[j.state] || 'plain';
      $('.state', card).replaceChildren(badge(cls, j.state || 'unknown'));
      const p = $('progress', card);
      p.max = Math.max(j.steps || 1, 1);
      p.value = Math.min(j.step || 0, p.max);
      $('.stats', card).replaceChildren(
        stat('step', num(j.step, 0) + (j.steps ? ' / ' + num(j.steps, 0) : '')),
        stat('loss', j.last_loss === null ? '—' : num(j.last_loss, 4)),
        stat('tokens/s', num(j.tokens_per_s, 0)),
        stat('codec', j.codec || '—'),
        stat('bytes/token', num(j.bytes_per_token, 0)),
        stat('sent', bytes(j.bytes_sent)),
        stat('recoveries', num(j.recoveries, 0)));
      if (j.error) $('.stats', card).append(stat('error', j.error));
      const q = 'job=' + encodeURIComponent(j.job_id) + '&v=' + encodeURIComponent(j.chart);
      if (j.loss_points > 0) setChart($('img.loss', card), '/dashboard/loss.svg?' + q, j.loss_points);
      setChart($('img.throughput', card), '/dashboard/throughput.svg?' + q, 0);
      fill($('.stages tbody', card), (j.stages || []).map((st) => row({}, [
        ['stage', st.index], ['blocks', st.first + '–' + (st.last - 1)],
        ['replicas', el('span', {}, ...(st.replicas || []).flatMap((r, i) => (i ? [', ', peer(r)] : [peer(r)])))],
        ['path', st.path || '—'],
      ])));
    }
    for (const card of box.querySelectorAll('article[data-job]')) {
      if (!seen.has(card.dataset.job)) card.remove();
    }
  }

  function renderBytes(s) {
    const list = s.bytes || [];
    $('#no-bytes').hidden = list.length > 0;
    fill($('#bytes tbody'), list.map((b) => row({}, [['codec', b.codec], ['sent', bytes(b.bytes), 'num']])));
    if (list.length > 0) setChart($('#bytes-chart'), '/dashboard/bytes.svg?v=' + encodeURIComponent(list.map((b) => b.codec + b.bytes).join()), list.length);
  }

  function renderLeaders(s) {
    const list = s.leaderboard || [];
    $('#no-leaders').hidden = list.length > 0;
    const self = s.node.peer_id;
    fill($('#leaderboard tbody'), list.map((e, i) => row({ 'data-peer': e.peer_id, class: e.peer_id === self ? 'self' : '' }, [
      ['#', i + 1, 'num'],
      ['peer', peer(e.peer_id), 'wide'],
      ['points', num(e.points, e.points < 1 ? 3 : 2), 'num'],
      ['present', dur(e.presence_s), 'num'],
      ['compute', dur(e.compute_s), 'num'],
      ['tokens', num(e.tokens, 0), 'num'],
      ['receipts', num(e.receipts, 0), 'num'],
    ])));
  }

  function render(s) {
    renderNode(s);
    renderCoordinator(s);
    renderSummary(s);
    renderFleet(s);
    renderJobs(s);
    renderBytes(s);
    renderLeaders(s);
    document.body.dataset.updated = s.now;
  }

  function live(state, text) {
    const l = $('#live');
    l.dataset.state = state;
    l.textContent = text;
  }

  let polling = false;
  function poll() {
    polling = true;
    fetch(STATE, { cache: 'no-store' })
      .then((r) => { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then((s) => { render(s); live('polling', 'updating every ' + POLL_MS / 1000 + ' s'); })
      .catch(() => live('offline', 'node unreachable'))
      .finally(() => setTimeout(poll, POLL_MS));
  }

  function connect() {
    if (!window.EventSource) { poll(); return; }
    const es = new EventSource(EVENTS);
    let failures = 0;
    es.addEventListener('state', (e) => {
      failures = 0;
      render(JSON.parse(e.data));
      live('live', 'live');
    });
    es.onerror = () => {
      failures++;
      live('offline', 'reconnecting…');
      // The node refuses streams beyond its limit, or a proxy may buffer
      // them: poll instead.
      if (es.readyState === EventSource.CLOSED || failures >= 3) {
        es.close();
        if (!polling) poll();
      }
    };
  }

  document.addEventListener('DOMContentLoaded', () => {
    fetch(STATE, { cache: 'no-store' }).then((r) => r.json()).then(render).catch(() => {});
    connect();
  });
})();
