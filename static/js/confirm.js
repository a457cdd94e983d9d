// A form with data-confirm="question" asks before it is sent; dismissing the question sends
// nothing. (The Content-Security-Policy refuses inline onsubmit handlers.)
document.addEventListener("submit", function (event) {
  var question = event.target.dataset ? event.target.dataset.confirm : "";
  if (question && !window.confirm(question)) event.preventDefault();
});
