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

  ready(function () {
    document.documentElement.classList.add("js");
    syncEnvironments();
    document.addEventListener("change", function (event) {
      var target = event.target;
      if (target.name === "hardware_class") syncEnvironments();
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
