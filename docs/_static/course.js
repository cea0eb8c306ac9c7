// The course website's one script (docs/conf.py: html_js_files): a table wider than the text column scrolls
// inside its frame (course.css); mark it, so the page says so above the table instead of hiding its last
// columns without a hint (review 2026-11-26, reader §4: lesson 08's benchmark table).
(function () {
  function mark() {
    document.querySelectorAll(".table-wrapper").forEach(function (w) {
      w.classList.toggle("scrolls-x", w.scrollWidth > w.clientWidth + 1);
    });
  }
  window.addEventListener("load", mark);
  window.addEventListener("resize", mark);
})();
