(function(){
  var cases=[].slice.call(document.querySelectorAll('details.case'));
  var count=document.getElementById('shown');
  function apply(){
    var mode=document.querySelector('input[name=f]:checked').value;
    var a=+document.getElementById('runA').value, b=+document.getElementById('runB').value, n=0;
    cases.forEach(function(el){
      var avg=el.dataset.avg.split(','), show=true;
      if(mode==='disagree'){show=el.dataset.disagree==='1';}
      else if(mode==='wins'||mode==='losses'){
        if(avg[a]===''||avg[b]===''){show=false;}
        else{var d=parseFloat(avg[b])-parseFloat(avg[a]); show=mode==='wins'?d>1e-9:d<-1e-9;}
      }
      el.classList.toggle('hidden',!show); if(show){n++;}
    });
    count.textContent=n+' of '+cases.length+' cases shown';
  }
  [].slice.call(document.querySelectorAll('.filters input,.filters select')).forEach(function(el){el.addEventListener('change',apply);});
  document.getElementById('openall').addEventListener('click',function(){cases.forEach(function(el){if(!el.classList.contains('hidden')){el.open=true;}});});
  document.getElementById('closeall').addEventListener('click',function(){cases.forEach(function(el){el.open=false;});});
  apply();
  document.addEventListener('mouseover',function(e){
    var m=e.target; if(m.tagName!=='MARK'||!m.dataset.p||m.title){return;}
    var g=m.closest('details.rollouts').dataset;
    m.title='the teacher wrote this token: pi*(y*) = '+(m.dataset.p/100).toFixed(2)+' > kappa '+g.kappa+
      ', and log pi*(y*) - log pi_theta(y*) = '+(m.dataset.g===undefined?'(not stored)':m.dataset.g)+' > tau '+g.tau;
  });
  var h=decodeURIComponent(location.hash.slice(1));
  if(h.indexOf('filter=')===0){
    var q={}; h.split('&').forEach(function(kv){var p=kv.split('='); q[p[0]]=p[1];});
    var r=document.querySelector('input[name=f][value="'+q.filter+'"]'); if(r){r.checked=true;}
    if(q.a){document.getElementById('runA').value=q.a;} if(q.b){document.getElementById('runB').value=q.b;}
    apply();
  }
  else if(h==='open-all'){[].slice.call(document.querySelectorAll('details')).forEach(function(el){el.open=true;});}
  else if(h){var el=document.getElementById(h); if(el&&el.tagName==='DETAILS'){
    el.open=true; [].slice.call(el.querySelectorAll('details')).forEach(function(d){d.open=true;}); el.scrollIntoView();}}
})();
