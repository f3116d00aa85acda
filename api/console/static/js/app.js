// The console's frame: the header (navigation, "open" box, token), the token form, and the
// view of the current route. Each view returns a function that stops its timers and sockets,
// called when the route changes.

import { ApiError, get, onTokenChange, onUnauthorized, setToken, token, tokenRole } from "./api.js";
import { clusterView } from "./cluster.js";
import { errorBox, h, notice, replace } from "./dom.js";
import { tenantsView, namespaceView } from "./namespaces.js";
import { overviewView } from "./overview.js";
import { currentRoute, hrefOfName } from "./routes.js";
import { topicView } from "./topic.js";

const main = document.getElementById("main");
const authSlot = document.getElementById("auth");
const who = document.getElementById("who");
const banner = document.getElementById("banner");
let disposeView = () => {};
let authOpen = false;

function renderWho() {
  const current = token();
  const role = tokenRole(current);
  replace(who,
    current ? h("span", { class: "who-role" }, role ? `token: ${role}` : "token set") : h("span", { class: "muted" },
      "no token"),
    h("button", { type: "button", class: "small", onclick: () => showAuth(null) }, current ? "Change" : "Sign in"),
    current ? h("button", { type: "button", class: "small", onclick: () => setToken("") }, "Sign out") : null);
}

/** The token form; `refusal` is the API's 401 that brought it up, shown above it. */
function showAuth(refusal, outcome) {
  authOpen = true;
  const input = h("input", { type: "password", name: "token", autocomplete: "off", placeholder: "JWT",
    "aria-label": "Token" });
  const submit = async (event) => {
    event.preventDefault();
    setToken(input.value);
    await checkToken();
  };
  replace(authSlot, h("section", { class: "panel auth-panel" },
    h("h2", {}, "Token"),
    h("p", { class: "muted" }, "This broker checks tokens. The token stays in this tab (sessionStorage) and goes " +
      "with every call."),
    refusal ? errorBox(refusal) : null,
    outcome || null,
    h("form", { class: "form-row", onsubmit: submit }, input, h("button", { type: "submit" }, "Use token"),
      h("button", { type: "button", onclick: hideAuth }, "Close"))));
  input.focus();
}

function hideAuth() {
  authOpen = false;
  replace(authSlot);
}

/** Ask the broker what it makes of the token: refused (401), limited (403) or a superuser. */
async function checkToken() {
  try {
    await get("/admin/v2/broker-stats/overview");
    hideAuth();
    route();
  } catch (error) {
    if (error.status === 401) {
      setToken("");
      showAuth(error, notice("The token was refused; it was not kept.", "warn"));
    } else if (error.status === 403) {
      hideAuth();
      replace(banner, notice(`Signed in as ${tokenRole() || "a role"}, which is not a superuser: ` +
        "what it may not see is marked as such.", "info"));
      route();
    } else {
      showAuth(null, errorBox(error));
    }
  }
}

function route() {
  disposeView();
  const r = currentRoute();
  document.querySelectorAll("[data-nav]").forEach((a) => {
    a.classList.toggle("active", a.dataset.nav === r.view || (a.dataset.nav === "tenants" && r.view === "namespace"));
  });
  const views = { overview: overviewView, tenants: tenantsView, namespace: namespaceView, topic: topicView,
    cluster: clusterView };
  try {
    disposeView = views[r.view](main, r) || (() => {});
  } catch (error) {
    disposeView = () => {};
    replace(main, errorBox(error));
  }
}

function openByName(event) {
  event.preventDefault();
  const input = event.target.elements.name;
  const href = hrefOfName(input.value);
  if (href) {
    location.hash = href;
    input.value = "";
  } else {
    replace(banner, errorBox(new ApiError(0, "invalid_name",
      `"${input.value}" is not tenant/namespace, tenant/namespace/topic or a topic name`)));
  }
}

onUnauthorized((error) => {
  if (!authOpen) showAuth(error);
});
onTokenChange(() => {
  replace(banner);
  renderWho();
});
document.getElementById("open-form").addEventListener("submit", openByName);
window.addEventListener("hashchange", () => {
  replace(banner);
  route();
});
window.addEventListener("unhandledrejection", (event) => replace(banner, errorBox(event.reason)));
window.addEventListener("error", (event) => replace(banner, errorBox(event.error || event.message)));
renderWho();
route();
