// Binôme's only script besides htmx. Everything works without it; it only smooths the forms.
(function () {
  "use strict";

  function ready(fn) {
    if (document.readyState !== "loading") fn();
    else document.addEventListener("DOMContentLoaded", fn);
  }

  // The environment list greys out the images that do not run on the chosen hardware class.
  function syncEnvironments() {
    var chosen = document.querySelector("input[name=hardware_class]:checked");
    var select = document.querySelector("select[name=environment]");
    if (!chosen || !select) return;
    var firstCompatible = null;
    Array.prototype.forEach.call(select.options, function (option) {
      var classes = (option.getAttribute("data-classes") || "").split(" ");
      var ok = classes.indexOf(chosen.value) !== -1;
      option.disabled = !ok;
      if (ok && firstCompatible === null) firstCompatible = option;
    });
    if (select.selectedOptions.length && select.selectedOptions[0].disabled && firstCompatible) {
      firstCompatible.selected = true;
    }
  }

  // A 30-day campaign's plan is asked only for a 30-day window (kept shown when it carries an error).
  function syncCampaign() {
    var plan = document.querySelector("[data-campaign]");
    var chosen = document.querySelector("input[name=days]:checked");
    if (!plan) return;
    plan.hidden = !(chosen && chosen.value === "30") && !plan.querySelector(".field-error");
  }

  // "Quote valid until …": add the minutes left, kept fresh (the server's time is in the datetime attribute).
  function updateCountdowns() {
    var lang = document.documentElement.lang || "en";
    document.querySelectorAll("time[data-countdown]").forEach(function (node) {
      var left = Math.round((Date.parse(node.getAttribute("datetime")) - Date.now()) / 60000);
      var label = node.querySelector(".countdown") || node.appendChild(document.createElement("span"));
      label.className = "countdown";
      if (left > 0) label.textContent = lang === "fr" ? " (encore " + left + " min)" : " (" + left + " min left)";
      else label.textContent = lang === "fr" ? " (expiré)" : " (expired)";
    });
  }

  ready(function () {
    document.documentElement.classList.add("js");
    updateCountdowns();
    window.setInterval(updateCountdowns, 30000);
    document.body.addEventListener("htmx:afterSwap", updateCountdowns);
    syncEnvironments();
    syncCampaign();
    document.addEventListener("change", function (event) {
      var target = event.target;
      if (target.name === "hardware_class") syncEnvironments();
      if (target.name === "days") syncCampaign();
      if (target.hasAttribute && target.hasAttribute("data-autosubmit")) target.form.submit();
    });
    document.addEventListener("click", function (event) {
      var button = event.target.closest ? event.target.closest("[data-confirm]") : null;
      if (button && !window.confirm(button.getAttribute("data-confirm"))) event.preventDefault();
      var copy = event.target.closest ? event.target.closest("[data-copy]") : null;
      if (copy && navigator.clipboard) {
        navigator.clipboard.writeText(copy.getAttribute("data-copy"));
        copy.classList.add("copied");
      }
    });
  });
})();
