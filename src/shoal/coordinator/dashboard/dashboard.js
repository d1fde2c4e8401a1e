// shoal's live dashboard. It polls the coordinator's public JSON API and
// draws the selected job (a click on the jobs table, #job=ID, or the newest)
// with charts.js: curves, membership, faults, money and anchored roots.
// curves.py computes the same curves on the server for the report.

const POLL_MS = 1500;
const PACE_WINDOW = 8;  // commits the throughput is averaged over
const PAGE = 1000, PROGRESS_PAGE = 5000;  // the API's longest answers

const state = {
  jobs: [], selected: null, events: [], eventSeq: 0, tick: 0,
  progress: new Map(),  // job id -> its committed steps, in step order
  membership: [], epochs: [],  // of the selected job
  names: new Map(),  // provider address -> name
  agents: new Map(),  // offer id -> agent id
};

// ------------------------------------------------------------ fetching
// Wei can pass 2^53: keep every integer JSON.parse would round as its text.
const SOURCE_ACCESS = (() => {
  let seen = false;
  JSON.parse("1", (k, v, context) => { seen = !!(context && "source" in context); return v; });
  return seen;
})();

function exactJSON(text) {
  if (!SOURCE_ACCESS) text = text.replace(/([:,[]\s*)(-?\d{16,})(?=\s*[,\]}])/g, '$1"$2"');
  return JSON.parse(text, (key, value, context) =>
    typeof value === "number" && !Number.isSafeInteger(value) && context &&
      /^-?\d+$/.test(context.source) ? context.source : value);
}

async function get(path) {
  const response = await fetch(path, {cache: "no-store"});
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return exactJSON(await response.text());
}

async function pollEvents() {
  // All events, not ?job=: an offer withdrawn (agent lost, slashed) names the
  // leases it ended, not a job.
  for (;;) {
    const batch = await get(`/v1/events?after=${state.eventSeq}&limit=${PAGE}`);
    state.events.push(...batch);
    if (batch.length) state.eventSeq = batch[batch.length - 1].seq;
    if (batch.length < PAGE) return;
  }
}

// A listing the API pages by key (jobs, providers): every page, each after the last row's.
async function getAll(path, key) {
  const rows = [];
  for (let after = null; ;) {
    const cursor = after === null ? "" : `&after=${encodeURIComponent(after)}`;
    const batch = await get(`${path}?limit=${PAGE}${cursor}`);
    rows.push(...batch);
    if (batch.length < PAGE) return rows;
    after = key(batch[batch.length - 1]);
  }
}

async function pollProviders() {
  for (const p of await getAll("/v1/providers", p => p.address)) {
    state.names.set(p.address, p.name);
    for (const offer of p.offers) state.agents.set(offer.offer_id, offer.agent_id);
  }
}

async function pollJob(job) {
  const id = encodeURIComponent(job.job_id);
  const steps = state.progress.get(job.job_id) || [];
  for (;;) {
    const after = steps.length ? steps[steps.length - 1].step : -1;
    const batch = await get(`/v1/jobs/${id}/progress?after=${after}`);
    steps.push(...batch);
    if (batch.length < PROGRESS_PAGE) break;
  }
  state.progress.set(job.job_id, steps);
  state.membership = await get(`/v1/jobs/${id}/membership`);
  state.epochs = await get(`/v1/jobs/${id}/proof/epochs`);
}

async function poll() {
  try {
    state.jobs = await getAll("/v1/jobs", j => j.job_id);
    await pollEvents();
    if (state.tick % 4 === 0) await pollProviders();
    const job = selectedJob();
    if (job) await pollJob(job);
    render(job);
    status(`updated ${new Date().toLocaleTimeString()}`, false);
  } catch (error) {
    status(`cannot read the coordinator: ${error.message}`, true);
  }
  state.tick += 1;
}

function selectedJob() {
  const wanted = state.selected || new URLSearchParams(location.hash.slice(1)).get("job");
  const chosen = state.jobs.find(j => j.job_id === wanted);
  if (chosen) return chosen;
  return state.jobs.reduce((a, b) => (a && a.created_at_s >= b.created_at_s ? a : b), null);
}

// ------------------------------------------------------------ the job's story
function jobEvents(job) {
  const leases = new Set(job.leases.map(l => l.lease));
  return state.events.filter(e => e.job_id === job.job_id ||
    (e.kind === "offer_withdrawn" && (e.detail.ended_leases || []).some(l => leases.has(l))));
}

function agentOfLease(job, lease) {
  const held = job.leases.find(l => l.lease === lease);
  return held ? state.agents.get(held.offer_id) || held.offer_id : `lease ${lease}`;
}

function party(address) {  // a table cell: the name, or the address where none is known
  const name = state.names.get(address);
  return name ? el("span", {title: address}, name) : hash(address || "");
}

// A fault is an event that cost the job members or time; null for the rest.
function faultOf(event, job, filledBefore) {
  const d = event.detail || {};
  switch (event.kind) {
    case "offer_withdrawn": {
      const reason = String(d.reason || "withdrawn");
      const kind = reason === "agent lost" ? "lost" : reason.startsWith("slashed") ? "slash" : "withdrawn";
      return {kind, who: state.agents.get(d.offer_id) || d.offer_id, text: reason};
    }
    case "job_filled":
      if ((d.notices || []).length) {
        return {kind: "preemption", who: d.notices.map(l => agentOfLease(job, l)).join(", "),
                text: `spot notice: ${d.reason || "preempted"}`};
      }
      if (filledBefore && (d.new_leases || []).length) {
        return {kind: "join", who: d.new_leases.map(l => agentOfLease(job, l)).join(", "),
                text: "leased as a replacement"};
      }
      return null;
    case "worker_slashed":
      return {kind: "slash", who: party(d.provider), text: `${d.worker} step ${d.step}: ${d.why}`};
    case "offer_marked_down":
      return {kind: "slow", who: state.agents.get(d.offer_id) || d.offer_id, text: "below its measured speed"};
    case "job_paused": case "job_failed": case "settlement_failed":
      return {kind: event.kind.replace("job_", "").replace("settlement_", ""), who: "",
              text: String(d.reason || event.kind)};
    default:
      return null;
  }
}

function faults(job, events) {
  const out = [];
  let filled = false;
  for (const e of events) {
    const fault = faultOf(e, job, filled);
    if (fault) out.push({...fault, at: e.at_s - job.created_at_s});
    if (e.kind === "job_filled" && (e.detail.new_leases || []).length) filled = true;
  }
  return out;
}

// ------------------------------------------------------------ curves
function throughput(steps, t0) {
  const out = [];
  for (let i = 1; i < steps.length; i++) {
    const first = Math.max(0, i - PACE_WINDOW);
    const seconds = steps[i].t - steps[first].t;
    let samples = 0;
    for (let j = first + 1; j <= i; j++) samples += steps[j].samples;
    out.push([steps[i].t - t0, seconds > 0 ? samples / seconds : null]);
  }
  return out;
}

function memberRows(job, t0, xmax) {
  const changes = [...state.membership].sort((a, b) => a.t - b.t);
  if (!changes.length) {  // no epoch formed yet: who holds a lease, when
    return job.leases.map(l => ({
      name: `l${l.lease} ${state.agents.get(l.offer_id) || l.offer_id}`, lease: true,
      spans: [[l.start_s - t0, l.ends_at_s == null ? xmax : Math.min(l.ends_at_s - t0, xmax)]]}));
  }
  const rows = new Map();
  changes.forEach((change, i) => {
    const start = change.t - t0, end = i + 1 < changes.length ? changes[i + 1].t - t0 : xmax;
    for (const member of change.members) {
      if (!rows.has(member)) rows.set(member, {name: member, lease: false, spans: []});
      const spans = rows.get(member).spans, last = spans[spans.length - 1];
      if (last && Math.abs(last[1] - start) < 1e-9) last[1] = end; else spans.push([start, end]);
    }
  });
  return [...rows.values()];
}

// ------------------------------------------------------------ the page
function render(job) {
  renderJobs(job);
  document.getElementById("job-title").textContent = job ? `${job.job_id} (${job.name})` : "none yet";
  if (!job) return;
  const t0 = job.created_at_s, steps = state.progress.get(job.job_id) || [];
  const events = jobEvents(job), found = faults(job, events);
  const times = [...steps.map(p => p.t), ...state.membership.map(m => m.t), ...events.map(e => e.at_s),
                 ...job.leases.map(l => l.start_s)];
  const xmax = times.reduce((most, t) => Math.max(most, t - t0), 1);
  lineChart(document.getElementById("loss-chart"), steps.map(p => [p.t - t0, p.loss]),
            {xmax, marks: found, series: "loss", pathId: "loss-path", yLabel: "training loss"});
  lineChart(document.getElementById("throughput-chart"), throughput(steps, t0),
            {xmax, marks: found, series: "pace", pathId: "throughput-path", yLabel: "samples/s"});
  timeline(document.getElementById("membership"), memberRows(job, t0, xmax),
           {xmax, marks: found, epochs: state.membership.map(m => [m.t - t0, m.epoch])});
  document.getElementById("membership-note").textContent = state.membership.length
    ? `${state.membership.length} membership epochs; dotted: an epoch starts`
    : "leases (the job host has formed no membership epoch yet)";
  document.getElementById("faults").replaceChildren(table(["at (s)", "kind", "who", "what"],
    found.map(f => [f.at.toFixed(1), kindBadge(f.kind), f.who, f.text]), [0]));
  renderMoney(job, events);
  document.getElementById("anchors").replaceChildren(table(
    ["epoch", "root", "records", "chain epoch", "transaction"],
    state.epochs.map(e => [e.epoch, hash(e.root), `${e.records}${e.complete ? "" : " (incomplete)"}`,
                           e.chain_epoch == null ? "" : e.chain_epoch,
                           e.anchor_tx ? hash(e.anchor_tx) : "not anchored"]), [0, 2, 3]));
}

function renderJobs(selected) {
  const rows = [...state.jobs].sort((a, b) => b.created_at_s - a.created_at_s).map(job => {
    const open = job.leases.filter(l => l.ends_at_s == null).length;
    const row = el("tr", {class: job === selected ? "job selected" : "job", "data-job": job.job_id},
      el("td", {}, job.job_id), el("td", {}, job.name), el("td", {}, job.status),
      el("td", {title: job.bundle_sha256 || ""},
         job.bundle_sha256 ? `bundle ${job.bundle_sha256.slice(0, 12)}` : "built-in GPT"),
      el("td", {class: "num"}, `${open} / ${job.workers}`), el("td", {class: "num"}, String(job.spent_wei)),
      el("td", {class: "num"}, String(job.budget_wei)), el("td", {}, job.chain_job == null ? "" : job.chain_job));
    row.addEventListener("click", () => {
      state.selected = job.job_id;
      history.replaceState(null, "", `#job=${encodeURIComponent(job.job_id)}`);
      wake();
    });
    return row;
  });
  document.querySelector("#jobs tbody").replaceChildren(...rows);
}

function renderMoney(job, events) {
  const settled = events.filter(e => e.kind === "job_settled").pop();
  const leases = table(["lease", "agent", "price (wei/s)", "held (s)", ""],
    job.leases.map(l => [l.lease, state.agents.get(l.offer_id) || l.offer_id, String(l.price_wei_per_s),
                         ((l.ends_at_s ?? Date.now() / 1000) - l.start_s).toFixed(0),
                         l.ends_at_s == null ? "open" : "ended"]), [0, 2, 3]);
  const parts = [el("p", {}, `spent ${job.spent_wei} of ${job.budget_wei} wei (metered)`), leases];
  if (settled) {
    const d = settled.detail, paid = d.wei || {};
    parts.push(el("h2", {}, `settled on chain job ${d.chain_job}`), table(["provider", "seconds", "paid (wei)"],
      Object.keys(paid).map(a => [party(a), (d.seconds || {})[a] ?? "",
                                  String(paid[a])]), [1, 2]));
  }
  document.getElementById("payments").replaceChildren(...parts);
  const slashes = events.filter(e => e.kind === "worker_slashed" || e.kind === "verdict_rejected");
  document.getElementById("slashes").replaceChildren(table(["at (s)", "who", "ruling", "transaction", "why"],
    slashes.map(e => [(e.at_s - job.created_at_s).toFixed(1),
                      e.kind === "worker_slashed" ? party(e.detail.provider)
                        : el("span", {}, "verifier ", party(e.detail.verifier)),
                      e.kind === "worker_slashed" ? kindBadge("slash") : "accusation rejected",
                      e.detail.tx ? hash(e.detail.tx) : (e.detail.chain_error || "off chain"),
                      e.detail.why || ""]), [0]));
}

function status(text, bad) {
  const node = document.getElementById("status");
  node.textContent = text;
  node.className = bad ? "sub bad" : "sub";
}

// One poll at a time; a click on a job cuts the wait short.
let wake = () => {};

function pause(ms) {
  return new Promise(resolve => {
    const timer = setTimeout(resolve, ms);
    wake = () => { clearTimeout(timer); resolve(); };
  });
}

(async () => {
  for (;;) {
    await poll();
    await pause(POLL_MS);
  }
})();
